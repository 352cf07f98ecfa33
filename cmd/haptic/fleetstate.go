// fleetstate.go owns `haptic agent state --agents-dns URL`: one row per
// pod of the fleet (its applied plan, generation, whether its tree is
// behind its state, and whether it is ready or why not), the pods that
// differ from the rest first, so that in a fleet of a hundred the one
// that is not like the others is the first line read.

package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/haptic-agent/haptic"
)

// diskBehindReason starts the readiness answer of an agent whose tree does
// not yet hold files it answered for: installing them after the answer
// failed, and the agent retries.
const diskBehindReason = "the agent's tree is not yet what its state says"

// podRow is one pod as the fleet table prints it.
type podRow struct {
	pod        string
	applied    string // plan id, "-" for none, "?" when unread
	generation string // "?" when unread
	disk       string // "in step", "behind", or "unknown" when readiness names another reason first
	ready      string // "ready", or why not
	unread     bool   // the state read failed
}

// likeness is what makes two pods alike: the generation is left out, since
// pods started at different times count their applies differently.
func (r podRow) likeness() string {
	return r.applied + "\x00" + r.disk + "\x00" + r.ready
}

// runFleetState reads every pod behind dnsURL at once (at most
// defaultPushParallel at a time), prints the table, and exits 1 when a pod
// could not be read.
func runFleetState(ctx context.Context, s stdio, dnsURL string, tlsConfig *tls.Config, creds agentCredentials,
	read haptic.StateRead, timeout time.Duration) int {
	urls, err := fleetURLs(ctx, s.lookup, dnsURL)
	if err != nil {
		fmt.Fprintf(s.err, "haptic agent state: %v\n", err)
		return exitFailure
	}
	rows := make([]podRow, len(urls))
	slots := make(chan struct{}, defaultPushParallel)
	var wg sync.WaitGroup
	for i, url := range urls {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			cfg := &haptic.ClientConfig{BaseURL: url, Username: creds.user, Password: creds.pass, Timeout: timeout, TLS: tlsConfig}
			rows[i] = readPod(ctx, cfg, read, creds)
		})
	}
	wg.Wait()
	printFleet(s.out, rows)
	if slices.ContainsFunc(rows, func(r podRow) bool { return r.unread }) {
		return exitFailure
	}
	return exitOK
}

// readPod reads one pod's state, then its readiness.
func readPod(ctx context.Context, cfg *haptic.ClientConfig, read haptic.StateRead, creds agentCredentials) podRow {
	row := podRow{pod: cfg.BaseURL, applied: "?", generation: "?", disk: "?"}
	client, err := haptic.NewClient(cfg)
	if err != nil {
		row.ready, row.unread = "not read: "+errText(err), true
		return row
	}
	defer client.Close()
	start := time.Now()
	state, err := client.State(ctx, read)
	if err != nil {
		row.ready, row.unread = "not read: "+explainErr(err, creds, time.Since(start)), true
		return row
	}
	row.applied, row.generation = orDash(state.AppliedPlanID), strconv.FormatUint(state.Generation, 10)
	why := readiness(ctx, cfg, creds)
	switch {
	case why == "":
		row.ready, row.disk = "ready", "in step"
	case strings.HasPrefix(why, diskBehindReason):
		row.ready, row.disk = why, "behind"
	default:
		// Readiness names one reason, the first it checks; the disk is
		// not among what it said.
		row.ready, row.disk = why, "unknown"
	}
	return row
}

// printFleet prints the table, the pods least like the others first: those
// that could not be read, then the smallest group of alike pods, each
// group in address order; then one line on how alike the fleet is.
func printFleet(w io.Writer, rows []podRow) {
	alike := map[string]int{} // of the pods read; an unread pod counts 0
	unread := 0
	for _, r := range rows {
		if r.unread {
			unread++
		} else {
			alike[r.likeness()]++
		}
	}
	slices.SortStableFunc(rows, func(a, b podRow) int {
		return cmp.Or(cmp.Compare(alike[a.likeness()], alike[b.likeness()]), strings.Compare(a.likeness(), b.likeness()))
	})
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprint(tw, "POD\tAPPLIED\tGENERATION\tDISK\tREADY\n")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.pod, r.applied, r.generation, r.disk, r.ready)
	}
	tw.Flush()
	pods := countOf(len(rows), "pod")
	if unread == len(rows) {
		fmt.Fprintf(w, "%s, none read\n", pods)
		return
	}
	most := rows[len(rows)-1]
	n := alike[most.likeness()]
	group := fmt.Sprintf("plan %s, disk %s, %s", most.applied, most.disk, most.ready)
	if n == len(rows) {
		fmt.Fprintf(w, "%s, all alike (%s)\n", pods, group)
		return
	}
	parts := nonZero(tally{n, "alike (" + group + ")"}, tally{len(rows) - n - unread, "differ"}, tally{unread, "not read"})
	fmt.Fprintf(w, "%s: %s\n", pods, strings.Join(parts, ", "))
}
