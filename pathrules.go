// This file holds the character rules a manifest path obeys at both ends of
// the wire: the client refuses such a path before it sends anything, and the
// agent refuses it again in validation. They live here once, so that the two
// ends cannot drift apart.

package haptic

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// pathCharProblem says why p holds a character no manifest path may hold,
// or returns "" when every character is acceptable. A path is a name an
// operator reads in logs, in `haptic agent state` and in HAProxy's own
// messages, and one HAProxy's configuration refers to:
//   - it must be valid UTF-8, so that every tool shows the same name;
//   - it must hold no control character (C0 including tab and newline, DEL,
//     or C1): a newline forges extra lines in a log, a state listing or a
//     runtime command, and the others are invisible;
//   - it must hold no bidirectional control (U+061C, U+200E, U+200F,
//     U+202A–U+202E, U+2066–U+2069): they make a name display as another
//     one ("cfg.exe" shown as "exe.cfg").
//
// NUL is a control character too; callers that report it with its own text
// check it first.
func pathCharProblem(p string) string {
	if !utf8.ValidString(p) {
		return "is not valid UTF-8"
	}
	for _, r := range p {
		switch {
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f):
			return "contains a control character"
		case isBidiControl(r):
			return "contains a bidirectional control character"
		}
	}
	return ""
}

// isBidiControl reports the Unicode bidirectional formatting characters:
// the Arabic letter mark, the LTR and RTL marks, the embeddings, overrides
// and their pop, and the isolates and their pop.
func isBidiControl(r rune) bool {
	switch {
	case r == 0x061c, r == 0x200e, r == 0x200f:
		return true
	case r >= 0x202a && r <= 0x202e:
		return true
	case r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// runtimePathKinds are the file kinds whose manifest path HAProxy's runtime
// API names them by: maps (add map, set map, clear map ...), certificates
// and CA files (set ssl cert, set ssl ca-file ...) and crt-lists (add ssl
// crt-list). The config and general files never travel in a runtime
// command.
var runtimePathKinds = map[string]bool{
	FileKindMap: true, FileKindCert: true, FileKindCA: true, FileKindCRTList: true,
}

// checkRuntimePath refuses a ';' in the path of a file whose path travels in
// runtime commands. The runtime API ends a command at ';', so such a path
// can never be carried whole: the next word would run as a command of its
// own. Other files may hold ';' (HAProxy's configuration syntax gives it no
// meaning). Spaces, '<', '>' and backslashes in such paths stay allowed: the
// controller's Diff turns every change of such a file into a reload, which is
// slower but never misread.
func checkRuntimePath(kind, rel string) error {
	if runtimePathKinds[kind] && strings.IndexByte(rel, ';') >= 0 {
		return fmt.Errorf("%w: %q contains ';', which ends a runtime API command, and the path of a %s file travels in runtime commands",
			errInvalidPath, rel, kind)
	}
	return nil
}
