package main

import (
	"fmt"

	"github.com/spf13/pflag"
)

// deprecatedAlias adds old as another name of the flag current: it sets
// the same value, is left out of help, and prints a notice naming current
// when used. Renamed flags keep their old name this way for one release,
// so scripts and pods of the last version go on working.
func deprecatedAlias(f *pflag.FlagSet, old, current string) {
	fl := f.Lookup(current)
	if fl == nil {
		panic("deprecatedAlias: no flag --" + current)
	}
	f.AddFlag(&pflag.Flag{Name: old, Usage: fl.Usage, Value: fl.Value, DefValue: fl.DefValue, NoOptDefVal: fl.NoOptDefVal})
	if err := f.MarkDeprecated(old, fmt.Sprintf("use --%s instead", current)); err != nil {
		panic(err)
	}
}

// metricsFlag registers --metrics-addr, the one name every command gives
// the address of its metrics.
func metricsFlag(f *pflag.FlagSet, addr *string) {
	f.StringVar(addr, "metrics-addr", "", "serve /metrics, /healthz and /readyz at `ADDR`, e.g. 127.0.0.1:9090 ("+notServedHelp+")")
}

// notServedHelp is how every address flag's help says it can be turned off.
const notServedHelp = "0 or empty: not served"

// served says whether an address flag asks for a server: "0" and empty
// both mean none, in every command, as controller-runtime (the operator)
// reads "0".
func served(addr string) bool { return addr != "" && addr != "0" }

// offAsZero is addr as controller-runtime takes it: it reads an empty
// metrics address as its default port, not as none.
func offAsZero(addr string) string {
	if !served(addr) {
		return "0"
	}
	return addr
}
