// Command app is the workload of the kind e2e (nothing can be pulled here,
// so the test builds its own image FROM scratch): `app serve ADDR` answers
// every HTTP request with the pod's name; `app get URL` fetches URL until it
// answers (at most two minutes) and prints the answer; with `--every D` it
// keeps fetching, printing each answer or error, each fetch on a new
// connection.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: app serve ADDR | app get URL [--every DURATION]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		name, _ := os.Hostname()
		err := http.ListenAndServe(os.Args[2], http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "pod %s\n", name)
		}))
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	case "get":
		fs := flag.NewFlagSet("get", flag.ExitOnError)
		every := fs.Duration("every", 0, "keep fetching at this interval")
		fs.Parse(os.Args[3:])
		url := os.Args[2]
		deadline := time.Now().Add(2 * time.Minute)
		for {
			body, err := get(url)
			if err == nil {
				fmt.Printf("answer: %s", body)
			} else {
				fmt.Printf("error: %v\n", err)
			}
			if *every == 0 && (err == nil || time.Now().After(deadline)) {
				if err != nil {
					os.Exit(1)
				}
				return
			}
			if *every > 0 {
				time.Sleep(*every)
			} else {
				time.Sleep(time.Second)
			}
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		os.Exit(2)
	}
}

func get(url string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	// Every fetch a connection of its own, as a new client's: one kept
	// alive would go on answering after its Service went away.
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		err = errors.Join(err, fmt.Errorf("status %s", resp.Status))
	}
	return string(b), err
}
