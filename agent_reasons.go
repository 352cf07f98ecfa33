// This file owns the reasons the agent gives for a reload in its log: a
// controller that asks for a reload sends only the mode, so the agent
// works out why from the plan it holds and the plan the apply carries.

package haptic

import "strings"

// reloadReason is the reason an apply's log line gives for its reload.
// For a reload the controller asked for (cause reasonMode) that carries
// the plan blob, it is Diff's reasons for going from the plan the agent
// holds to the new one, the words the controller's own decision had:
// "core section backend api-servers added" tells an operator reading the
// log what "mode" does not. Any other cause is the agent's own (unknown
// baseline, refused op, new worker) and is kept, as is "mode" when the
// agent cannot tell: the apply carried no plan, or the agent holds no plan
// for the files it applied last.
func (run *applyRun) reloadReason(cause string) string {
	if cause != reasonMode || len(run.blob) == 0 {
		return cause
	}
	st := run.led.stateAnswer("", true)
	next, err := DecodePlanBlob(run.blob)
	if err != nil {
		return cause
	}
	base, err := BaselineFromState(&st)
	if err != nil || base.Applied == nil && st.AppliedPlanID != "" {
		return cause
	}
	if d := Diff(next, base); len(d.Reasons) > 0 {
		return strings.Join(d.Reasons, "; ")
	}
	return cause
}
