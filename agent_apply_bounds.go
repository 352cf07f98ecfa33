// This file holds what bounds one apply request's cost on the agent before
// and while it is admitted, beside the pipeline in agent_apply.go: how a
// staging failure is answered (the agent's fault or the client's).

package haptic

import (
	"errors"
	"net/http"
)

// stagingStatus is the HTTP status of a failed staging. A part that does
// not match its manifest, a part the manifest does not list or a body cut
// short is the client's fault (400). A failure of the agent's own disk is
// the agent's fault: 507 Insufficient Storage when the disk or the quota is
// full, 500 for anything else (read-only, immutable, I/O error). A 5xx
// tells the controller that its render is fine and the apply may be
// retried once the pod is repaired.
func stagingStatus(err error) int {
	var fault *stagingFault
	switch {
	case !errors.As(err, &fault):
		return http.StatusBadRequest
	case isNoSpace(fault.err):
		return http.StatusInsufficientStorage
	default:
		return http.StatusInternalServerError
	}
}
