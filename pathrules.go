// This file holds the rules a manifest path obeys at both ends of the wire:
// the client refuses a path before it sends anything, and the agent refuses
// it again in validation. They live here once, so that the two ends cannot
// drift apart.

package haptic

import (
	"fmt"
	"path"
	"strings"
	"unicode/utf8"
)

// manifestPathProblem says why rel is no manifest path, or returns "", in
// the agent's words or (client) the client's, each end in its own order.
// The agent refuses every component that starts with a dot, which keeps its
// own files (the state file, .haptic-tmp) out of any manifest's reach; the
// client refuses only "..", and leaves the rest to the agent.
//
// A path is a name an operator reads in logs, in `haptic agent state` and
// in HAProxy's own messages, and one HAProxy's configuration refers to. It
// must be valid UTF-8, so that every tool shows the same name; hold no
// control character (C0 including tab and newline, DEL, or C1), since a
// newline forges extra lines in a log, a state listing or a runtime command
// and the others are invisible; and hold no bidirectional control, which
// makes a name display as another one ("cfg.exe" shown as "exe.cfg").
func manifestPathProblem(rel string, client bool) string {
	say := func(agentWords, clientWords string) string {
		if client {
			return clientWords
		}
		return agentWords
	}
	clean := path.Clean(rel) == rel
	switch {
	case rel == "":
		return "is empty"
	case len(rel) > MaxPathBytes:
		return fmt.Sprintf("exceeds %d bytes", MaxPathBytes)
	case path.IsAbs(rel):
		return say("is absolute", "must be relative to the base dir")
	case !clean && !client:
		return "is not canonical"
	case strings.IndexByte(rel, 0) >= 0:
		return say("contains NUL", "contains a NUL byte")
	case !utf8.ValidString(rel):
		return "is not valid UTF-8"
	}
	for _, r := range rel {
		switch {
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f):
			return "contains a control character"
		case r == 0x061c || r == 0x200e || r == 0x200f || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069):
			return "contains a bidirectional control character" // the Arabic letter mark, LTR and RTL marks, embeddings, overrides, isolates
		}
	}
	switch {
	case !clean:
		return "is not in cleaned form"
	case client && (rel == ".." || strings.HasPrefix(rel, "../")):
		return "escapes the base dir"
	case !client && (strings.HasPrefix(rel, ".") || strings.Contains(rel, "/.")):
		return "has a component starting with a dot"
	}
	return ""
}

// runtimePathKinds are the file kinds HAProxy's runtime API names by their
// manifest path: maps, certificates, CA files and crt-lists. The config and
// general files never travel in a runtime command.
var runtimePathKinds = map[string]bool{
	FileKindMap: true, FileKindCert: true, FileKindCA: true, FileKindCRTList: true,
}

// checkRuntimePath refuses a ';' in the path of a file whose path travels in
// runtime commands: the runtime API ends a command at ';', so the next word
// would run as a command of its own. Other files may hold it (HAProxy's
// configuration gives it no meaning). Spaces, '<', '>' and backslashes stay
// allowed: Diff turns every change of such a file into a reload, which is
// slower but never misread.
func checkRuntimePath(kind, rel string) error {
	if runtimePathKinds[kind] && strings.IndexByte(rel, ';') >= 0 {
		return fmt.Errorf("%w: %q contains ';', which ends a runtime API command, and the path of a %s file travels in runtime commands",
			errInvalidPath, rel, kind)
	}
	return nil
}
