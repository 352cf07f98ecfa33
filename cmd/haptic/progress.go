// progress.go owns what a push shows while it runs: on a terminal, one
// line below the agents' lines naming the agents still pending, redrawn in
// place; anywhere else, nothing but the agents' lines, so that a log or a
// pipe gets plain text.

package main

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// clearLine returns the cursor to the start of the line and erases it.
const clearLine = "\r\x1b[K"

// defaultColumns is the terminal width assumed when COLUMNS is not set.
const defaultColumns = 80

// terminalColumns reads the terminal width a shell exports as COLUMNS.
func terminalColumns(getenv func(string) string) int {
	if n, err := strconv.Atoi(getenv("COLUMNS")); err == nil && n > 10 {
		return n
	}
	return defaultColumns
}

// progress is a push's output while it runs, and the outcomes it gathers
// for the summary. Its mutex also serialises the agents' lines, so that
// two never interleave.
type progress struct {
	mu          sync.Mutex
	out         io.Writer
	o           pushOptions
	total, done int
	counts      map[string]int       // outcomes so far
	untouched   []string             // agents a canary that did not pass left alone
	pending     map[string]time.Time // agents in flight → when they started
	drawn       bool                 // a progress line is on the screen

	// The lines held for the summary, "url: ...", each agent's in the
	// first list it belongs to: the agents that failed, those whose
	// outcome --expect does not list, the canaries not ready after the
	// push, and those that acknowledged with an error in their answer.
	failedLines, unexpected, notReady, ackErrors []string

	stopTick chan struct{}
	ticker   sync.WaitGroup
}

func newProgress(out io.Writer, total int, o pushOptions) *progress {
	p := &progress{out: out, o: o, total: total, counts: map[string]int{}, pending: map[string]time.Time{},
		stopTick: make(chan struct{})}
	if o.terminal {
		p.ticker.Go(func() {
			t := time.NewTicker(progressInterval)
			defer t.Stop()
			for {
				select {
				case <-p.stopTick:
					return
				case <-t.C:
					p.mu.Lock()
					p.drawLocked()
					p.mu.Unlock()
				}
			}
		})
	}
	return p
}

// started records an agent in flight.
func (p *progress) started(url string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending[url] = at
	p.drawLocked()
}

// finished records an agent's outcome and prints its line once: an agent
// that needs the operator's attention in the summary, where such lines are
// gathered and sorted, any other as it finishes, above the progress line
// (unless the push is quiet). Printing a line in both places doubled a
// fleet's output, and the second copy of HAProxy's message buried the
// first. notReady marks a canary that took the plan and is not ready after
// it; ackError an answer that acknowledged the plan and carries an error.
func (p *progress) finished(url, line, outcome string, notReady, ackError bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.pending, url)
	p.done++
	p.counts[outcome]++
	switch {
	case outcome == outcomeFailed:
		p.failedLines = append(p.failedLines, line)
	case p.o.expect != nil && !p.o.expect[outcome]:
		p.unexpected = append(p.unexpected, line)
	case notReady:
		p.notReady = append(p.notReady, line)
	case ackError:
		p.ackErrors = append(p.ackErrors, line)
	default:
		p.sayLocked(line)
		return
	}
	p.drawLocked()
}

// say writes a line of the push's own (not an agent's), as finished does.
func (p *progress) say(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sayLocked(line)
}

func (p *progress) sayLocked(line string) {
	if !p.o.quiet {
		p.clearLocked()
		fmt.Fprintln(p.out, line)
	}
	p.drawLocked()
}

// stop ends the redraws and erases the progress line.
func (p *progress) stop() {
	close(p.stopTick)
	p.ticker.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
}

func (p *progress) clearLocked() {
	if p.drawn {
		io.WriteString(p.out, clearLine)
		p.drawn = false
	}
}

// drawLocked redraws the progress line on a terminal: the count done, the
// failures, and the agents in flight, longest waiting first with how long
// they have waited, cut to the terminal's width so that it never wraps
// (a wrapped line cannot be redrawn in place).
func (p *progress) drawLocked() {
	if !p.o.terminal {
		return
	}
	urls := slices.Collect(maps.Keys(p.pending))
	slices.SortFunc(urls, func(a, b string) int { return cmp.Or(p.pending[a].Compare(p.pending[b]), strings.Compare(a, b)) })
	now := time.Now()
	var b strings.Builder
	fmt.Fprintf(&b, "[%d/%d done, %d failed] pending %d", p.done, p.total, p.counts[outcomeFailed], p.total-p.done)
	sep := ": "
	for _, u := range urls {
		fmt.Fprintf(&b, "%s%s %s", sep, u, now.Sub(p.pending[u]).Round(time.Second))
		sep = ", "
	}
	line := b.String()
	if max := p.o.columns - 1; utf8.RuneCountInString(line) > max {
		runes := []rune(line)
		line = string(runes[:max-1]) + "…"
	}
	io.WriteString(p.out, clearLine+line)
	p.drawn = true
}
