// This file owns the answers that depend on whether the agent is ready:
// GET /readyz, which reports HAProxy lost (the watch, agent_haproxy_watch.go),
// a broken or stuck state log, a tree behind its state and a late mount,
// and the wait of a state read that arrives before initialisation.
//
// It never probes HAProxy itself and never changes what it reports on: it
// reads what the watch, the ledger and the file store recorded.

package haptic

import (
	"context"
	"net/http"
	"time"
)

const (
	// stateInitGrace is how long a state read waits for an initialisation
	// that HAProxy does not hold up (the agent is hashing its files or
	// recovering): a controller that reads right after a restart gets the
	// state, not an error.
	stateInitGrace = 2 * time.Second
	stateInitPoll  = 50 * time.Millisecond // how often such a read looks again
)

// handleReadyz answers 200 "ready" once initialised while HAProxy answers,
// 503 "initialising" before, and 503 with the reason when HAProxy went away
// after startup: a pod whose HAProxy is gone must leave the load balancer
// and be seen, whatever its agent last applied. So must one whose state log
// is broken (its agent refuses every apply until a new snapshot is written:
// the compaction that follows an apply's answer), and one whose tree does
// not hold files its agent answered for.
func (a *Agent) handleReadyz(w http.ResponseWriter, r *http.Request) {
	lost, _ := a.haproxy.lost.Load().(string)
	broken, behind, stuck := a.led.faults()
	late := a.files.lateMount()
	switch {
	case !a.Ready():
		writeText(w, http.StatusServiceUnavailable, "initialising")
	case lost != "":
		writeText(w, http.StatusServiceUnavailable, "haproxy unreachable: "+lost)
	case broken != nil:
		writeText(w, http.StatusServiceUnavailable, msgLogBroken+": "+broken.Error())
	case behind != nil:
		writeText(w, http.StatusServiceUnavailable, msgDiskBehind+": "+behind.Error())
	case stuck != nil:
		writeText(w, http.StatusServiceUnavailable, msgLogStuck+": "+stuck.Error())
	case late != nil:
		writeText(w, http.StatusServiceUnavailable, msgLateMount+": "+late.Error())
	default:
		writeText(w, http.StatusOK, "ready")
	}
}

// awaitInitialised waits for initialisation on behalf of a state read. It
// returns "" once initialised, or the message of the 503 to answer: at
// once while HAProxy does not answer the startup probe, after
// stateInitGrace otherwise. ok is false when the request ended first.
func (a *Agent) awaitInitialised(ctx context.Context) (message string, ok bool) {
	grace := time.After(stateInitGrace)
	tick := time.NewTicker(stateInitPoll)
	defer tick.Stop()
	for {
		if waiting, _ := a.haproxy.waiting.Load().(string); waiting != "" && !a.Ready() {
			return waiting, true
		}
		select {
		case <-a.initialized:
			return "", true
		case <-ctx.Done():
			return "", false
		case <-grace:
			return msgAgentInitialising, true
		case <-tick.C:
		}
	}
}
