package main

import (
	"crypto/sha256"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay"
)

// fileCheck is how often a standalone relay looks whether its manifests or
// certificate files changed.
const fileCheck = 2 * time.Second

// standaloneFiles are what a standalone relay runs from: its manifests,
// and its CA (a bundle during a rotation), certificate and key.
type standaloneFiles struct {
	manifests     []string
	ca, cert, key string
	log           *slog.Logger
	relay         *relay.Relay
	identity      *pki.Identity
	// rejected counts a reload refused (manifests, certificates).
	rejected func(what string)

	lastSum                   [32]byte // of every file, as last applied
	lastCA, lastCert, lastKey []byte   // the certificate files in force
}

// loaded records the certificate files the relay started with.
func (f *standaloneFiles) loaded() {
	f.lastCA, _ = os.ReadFile(f.ca)
	f.lastCert, _ = os.ReadFile(f.cert)
	f.lastKey, _ = os.ReadFile(f.key)
}

// watch applies changed files to the running relay on SIGHUP and when the
// files change, until stop is closed: the certificates through
// Identity.Update (a CA bundle and a new certificate take effect together,
// and connections to peers the new CAs no longer trust close), then the
// manifests through Relay.Update, as the cluster path applies the API's
// objects. A change that fails its checks is logged and leaves the relay
// as it was.
func (f *standaloneFiles) watch(stop <-chan struct{}) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	f.lastSum = f.sum()
	t := time.NewTicker(fileCheck)
	defer t.Stop()
	for {
		forced := false
		select {
		case <-stop:
			return
		case <-hup:
			forced = true
		case <-t.C:
		}
		sum := f.sum()
		if sum == f.lastSum && !forced {
			continue
		}
		f.lastSum = sum
		f.reload(forced)
	}
}

// reload reads the files and applies what changed.
func (f *standaloneFiles) reload(forced bool) {
	ca, err1 := os.ReadFile(f.ca)
	cert, err2 := os.ReadFile(f.cert)
	key, err3 := os.ReadFile(f.key)
	switch err := errors.Join(err1, err2, err3); {
	case err != nil:
		f.rejected("certificates")
		f.log.Error("cannot read the certificate files; keeping the current ones", "err", err)
	case !slices.Equal(ca, f.lastCA) || !slices.Equal(cert, f.lastCert) || !slices.Equal(key, f.lastKey):
		if err := f.identity.Update(ca, cert, key); err != nil {
			f.rejected("certificates")
			f.log.Error("new certificate files rejected; keeping the current ones", "ca", f.ca, "cert", f.cert, "err", err)
		} else {
			f.lastCA, f.lastCert, f.lastKey = ca, cert, key
			f.log.Info("certificates reloaded", "expires", f.identity.NotAfter().UTC().Format(time.RFC3339))
		}
	}
	set, err := loadManifests(f.manifests, f.log)
	if err != nil {
		f.rejected("manifests")
		f.log.Error("manifests rejected; keeping the current ones", "err", err)
		return
	}
	if err := f.relay.Update(set); err != nil {
		f.log.Error("manifests applied in part", "err", err)
		return
	}
	f.log.Info("manifests reloaded", "signal", forced)
}

// sum fingerprints the files' contents (and a directory's file list).
func (f *standaloneFiles) sum() [32]byte {
	h := sha256.New()
	add := func(p string) {
		h.Write([]byte(p))
		b, _ := os.ReadFile(p)
		h.Write(b)
	}
	for _, p := range f.manifests {
		st, err := os.Stat(p)
		if err != nil {
			h.Write([]byte("missing " + p))
			continue
		}
		if !st.IsDir() {
			add(p)
			continue
		}
		entries, _ := os.ReadDir(p)
		for _, e := range entries {
			switch strings.ToLower(filepath.Ext(e.Name())) {
			case ".yaml", ".yml", ".json":
				add(filepath.Join(p, e.Name()))
			}
		}
	}
	for _, p := range []string{f.ca, f.cert, f.key} {
		add(p)
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}
