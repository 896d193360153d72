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
	f.StringVar(addr, "metrics-addr", "", "serve /metrics, /healthz and /readyz at `ADDR`, e.g. 127.0.0.1:9090 (empty: not served)")
}
