// The tests that hold api/openapi.yaml to the code it documents: every
// JSON type of haptic.go is a schema of the same name whose members, JSON
// types, required members, enums and limits are what the Go type and the
// constants say, and nothing more; and the document's routes, parts and
// parameters are the ones the agent serves. The document is block YAML,
// read by internal/yamlsubset; what the agent answers is checked against
// it by openapi_answers_test.go.

package haptic

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/haptic-agent/haptic/internal/yamlsubset"
)

const openAPIPath = "api/openapi.yaml"

var openAPI = sync.OnceValues(func() (map[string]any, error) {
	src, err := os.ReadFile(openAPIPath)
	if err != nil {
		return nil, err
	}
	doc, err := yamlsubset.Parse(string(src))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", openAPIPath, err)
	}
	m, ok := doc.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s is not a mapping", openAPIPath)
	}
	return m, nil
})

// openAPIDoc is the document, read once for every test.
func openAPIDoc(t testing.TB) map[string]any {
	t.Helper()
	doc, err := openAPI()
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// node follows keys from n; nil when the path does not exist.
func node(n any, keys ...string) any {
	for _, k := range keys {
		m, ok := n.(map[string]any)
		if !ok {
			return nil
		}
		n = m[k]
	}
	return n
}

func mapNode(n any, keys ...string) map[string]any {
	m, _ := node(n, keys...).(map[string]any)
	return m
}

// wireTypes are the JSON types of haptic.go, each a schema of its name.
var wireTypes = []reflect.Type{
	reflect.TypeFor[Manifest](), reflect.TypeFor[Token](), reflect.TypeFor[ManifestFile](),
	reflect.TypeFor[FilePatch](), reflect.TypeFor[PlanPatch](), reflect.TypeFor[PlanSplice](),
	reflect.TypeFor[Op](), reflect.TypeFor[KeywordArg](),
	reflect.TypeFor[OpResult](), reflect.TypeFor[HAProxyInfo](), reflect.TypeFor[State](),
	reflect.TypeFor[FileAt](), reflect.TypeFor[Inventory](), reflect.TypeFor[PendingDeletes](),
	reflect.TypeFor[ApplyResult](), reflect.TypeFor[ApplyTiming](), reflect.TypeFor[ReloadInfo](),
	reflect.TypeFor[RollbackInfo](), reflect.TypeFor[ApplyError](), reflect.TypeFor[Conflict](),
	reflect.TypeFor[Missing](), reflect.TypeFor[PlanStored](), reflect.TypeFor[PlanMoved](),
	reflect.TypeFor[DrainResult](),
}

// haptic.go, parsed once: its struct types and constant groups are what
// the document is held to, so that a type or a constant added there and
// not here fails the test.
var hapticGo = sync.OnceValues(func() (*ast.File, error) {
	return parser.ParseFile(token.NewFileSet(), "haptic.go", nil, 0)
})

// declaredWireTypes are the exported struct types of haptic.go, but
// StateRead, which never travels.
func declaredWireTypes(t *testing.T) []string {
	t.Helper()
	f, err := hapticGo()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	ast.Inspect(f, func(n ast.Node) bool {
		if ts, ok := n.(*ast.TypeSpec); ok && ts.Name.IsExported() && ts.Name.Name != "StateRead" {
			if _, isStruct := ts.Type.(*ast.StructType); isStruct {
				names = append(names, ts.Name.Name)
			}
		}
		return true
	})
	return names
}

// constGroup is the values of haptic.go's exported string constants whose
// names are prefix followed by an upper-case letter, in declaration order:
// constGroup(t, "Mode") is ModeAuto, ModeReload and ModeRevertLKG.
func constGroup(t *testing.T, prefix string) []string {
	t.Helper()
	f, err := hapticGo()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range f.Decls {
		gen, ok := d.(*ast.GenDecl)
		if !ok || gen.Tok != token.CONST {
			continue
		}
		for _, s := range gen.Specs {
			vs := s.(*ast.ValueSpec)
			for i, name := range vs.Names {
				rest, found := strings.CutPrefix(name.Name, prefix)
				if !found || rest == "" || rest[0] < 'A' || rest[0] > 'Z' || i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					v, _ := strconv.Unquote(lit.Value)
					out = append(out, v)
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("haptic.go declares no constant %s*", prefix)
	}
	return out
}

// The keyword values of a constraint, as the YAML reader gives them.
func decimal(n int) string { return strconv.Itoa(n) }

func textList(values []string) []any {
	out := make([]any, len(values))
	for i, v := range values {
		out[i] = v
	}
	return out
}

// safeWordPattern stands for a pattern that must accept exactly the words
// SafeToken accepts; the test tries it on samples instead of comparing
// spellings of a regular expression.
const safeWordPattern = "<SafeToken>"

// openEnum stands for the items of a list whose known values are these
// but which a later agent of API v1 may extend: anyOf the enum or any
// string.
type openEnum []string

// wireConstraints are what the Go types cannot say: the enums of their
// string members, the limits the agent enforces on them, and the formats
// of their times, by "Type.member" ("[]" for the items of a list). Each
// comes from the constant or the check that holds it.
func wireConstraints(t *testing.T) map[string]map[string]any {
	enum := func(prefix string) []any { return textList(constGroup(t, prefix)) }
	token := map[string]any{"pattern": safeWordPattern}
	dateTime := map[string]any{"format": "date-time"}
	inventory := map[string]any{"maxItems": decimal(MaxInventoryEntries)}
	c := map[string]map[string]any{
		"Manifest.plan_id":        {"minLength": "1"}, // errPlanIDEmpty
		"Manifest.files":          {"maxItems": decimal(MaxFiles)},
		"Manifest.ops":            {"maxItems": decimal(MaxOpsPerApply)},
		"Manifest.op_batches":     {"maxItems": decimal(MaxOpBatches - 1)}, // ops is the first batch
		"Manifest.op_batches[]":   {"minItems": "1", "maxItems": decimal(MaxOpsPerApply)},
		"Manifest.in_place_ops":   {"maxItems": decimal(MaxOpsPerApply)},
		"Manifest.mode":           {"enum": enum("Mode")},
		"ManifestFile.path":       {"maxLength": decimal(MaxPathBytes)},
		"ManifestFile.digest":     {"minLength": "1"}, // validateManifest: "has no digest"
		"ManifestFile.kind":       {"enum": enum("FileKind")},
		"FilePatch.base_size":     {"minimum": "0"}, // a patch must fit
		"FilePatch.offset":        {"minimum": "0"},
		"FilePatch.length":        {"minimum": "0"},
		"PlanPatch.base_size":     {"minimum": "0"}, // splicePlan: a patch must fit
		"PlanPatch.splices":       {"maxItems": decimal(MaxPlanSplices)},
		"PlanSplice.offset":       {"minimum": "0"},
		"PlanSplice.length":       {"minimum": "0"},
		"Op.kind":                 {"enum": enum("Op")},
		"Op.backend":              token,
		"Op.server":               token,
		"Op.profile":              token,
		"Op.mode":                 {"enum": []any{"http", "tcp"}}, // compileOp's backend_add
		"Op.guid":                 token,
		"Op.address":              token,
		"Op.port":                 {"maximum": "65535"}, // compileOp's checkRange
		"Op.weight":               {"minimum": "0", "maximum": "256"},
		"Op.state":                {"enum": enum("ServerState")},
		"Op.timeout_ms":           {"minimum": "1", "maximum": decimal(MaxWaitBudgetMs)},
		"Op.path":                 token,
		"Op.key":                  token,
		"Op.cert":                 token,
		"Op.sni_filters[]":        token,
		"KeywordArg.name":         token,
		"KeywordArg.args[]":       token,
		"OpResult.kind":           {"enum": enum("Op")},
		"State.agent_ops[]":       {"enum": enum("Op")},
		"State.features[]":        {"enum": openEnum(constGroup(t, "Feature"))},
		"State.applied_plan":      {"contentMediaType": "application/zstd"},
		"State.reload_pending_at": dateTime,
		// The invariant names are the metric's closed label set.
		"State.invariant_violation": {"enum": textList(exposedSeries(t)["haptic_agent_invariant_violations_total"]["name"])},
		"Inventory.maps":            inventory,
		"Inventory.certs":           inventory,
		"Inventory.ca_files":        inventory,
		"Inventory.crl_files":       inventory,
		"Inventory.crt_lists":       inventory,
		"PendingDeletes.servers":    {"maxItems": decimal(MaxPendingServerDeletes)},
		"PendingDeletes.backends":   {"maxItems": decimal(MaxPendingBackendDeletes)},
		"ApplyResult.mode":          {"enum": enum("Result")},
		"ApplyResult.at":            dateTime,
		"ReloadInfo.scheduled_at":   dateTime,
		"ApplyError.stage":          {"enum": enum("Stage")},
		"Conflict.reason":           {"enum": enum("Reason")},
		"Missing.missing":           {"maxItems": decimal(MaxFiles + 1)}, // the files, and "plan"
		"Missing.missing[]":         {"maxLength": decimal(MaxPathBytes)},
		"DrainResult.reason":        {"enum": enum("DrainReason")},
	}
	if !slices.Equal(constGroup(t, "Op"), opKinds[:]) {
		t.Errorf("the Op* constants and opKinds differ")
	}
	return c
}

// expectedSchema is the schema a value of type typ encodes as, at "at",
// without descriptions: the JSON type Go's encoder writes, then the
// constraints of at. nullable: a list, map or byte string that is written
// when empty (no omitempty) travels as null when nil. used records every
// constraint applied.
func expectedSchema(typ reflect.Type, at string, nullable bool, constraints map[string]map[string]any, used map[string]bool) map[string]any {
	orNull := func(t string) any {
		if nullable {
			return []any{t, "null"}
		}
		return t
	}
	var s map[string]any
	switch typ.Kind() {
	case reflect.Pointer:
		return expectedSchema(typ.Elem(), at, false, constraints, used)
	case reflect.String:
		s = map[string]any{"type": "string"}
	case reflect.Bool:
		s = map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int64:
		s = map[string]any{"type": "integer", "format": "int64"}
	case reflect.Uint64:
		s = map[string]any{"type": "integer", "format": "uint64"}
	case reflect.Struct:
		s = map[string]any{"$ref": "#/components/schemas/" + typ.Name()}
	case reflect.Slice:
		if typ.Elem().Kind() == reflect.Uint8 {
			s = map[string]any{"type": orNull("string"), "contentEncoding": "base64"}
			break
		}
		// A list inside a list is never left out, and the agent refuses a
		// null batch as it refuses an empty one, so it is not nullable.
		s = map[string]any{"type": orNull("array"), "items": expectedSchema(typ.Elem(), at+"[]", false, constraints, used)}
	case reflect.Map:
		s = map[string]any{"type": orNull("object"), "additionalProperties": expectedSchema(typ.Elem(), at+"{}", false, constraints, used)}
	default:
		s = map[string]any{"type": "unsupported Go kind " + typ.Kind().String()}
	}
	if extra, ok := constraints[at]; ok {
		used[at] = true
		for k, v := range extra {
			if open, ok := v.(openEnum); ok {
				s = map[string]any{"anyOf": []any{
					map[string]any{"type": "string", "enum": textList(open)},
					map[string]any{"type": "string"},
				}}
				continue
			}
			s[k] = v
		}
	}
	return s
}

// jsonName is a field's JSON name and whether it is omitempty.
func jsonName(f reflect.StructField) (string, bool) {
	name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
	return name, slices.Contains(strings.Split(opts, ","), "omitempty")
}

// withoutDescriptions is n with every description removed, checking on
// the way that each schema and member has one.
func withoutDescriptions(t *testing.T, n any, at string, needs bool) any {
	switch n := n.(type) {
	case map[string]any:
		out := map[string]any{}
		if d, _ := n["description"].(string); needs && strings.TrimSpace(d) == "" {
			t.Errorf("%s has no description", at)
		}
		for k, v := range n {
			switch k {
			case "description":
			case "properties":
				props := map[string]any{}
				for name, p := range v.(map[string]any) {
					props[name] = withoutDescriptions(t, p, at+"."+name, true)
				}
				out[k] = props
			default:
				out[k] = withoutDescriptions(t, v, at, false)
			}
		}
		return out
	case []any:
		out := make([]any, len(n))
		for i, v := range n {
			out[i] = withoutDescriptions(t, v, at, false)
		}
		return out
	}
	return n
}

// diffNodes reports where got and want differ, key by key.
func diffNodes(t *testing.T, at string, got, want any) {
	t.Helper()
	gm, gok := got.(map[string]any)
	wm, wok := want.(map[string]any)
	if !gok || !wok {
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: the document says %v, the code %v", at, got, want)
		}
		return
	}
	for _, k := range slices.Sorted(maps.Keys(gm)) {
		if _, ok := wm[k]; !ok {
			t.Errorf("%s: the document has %s: %v, which the code lacks", at, k, gm[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(wm)) {
		if _, ok := gm[k]; !ok {
			t.Errorf("%s: the document lacks %s: %v", at, k, wm[k])
			continue
		}
		diffNodes(t, at+"."+k, gm[k], wm[k])
	}
}

func TestOpenAPIDocumentMatchesTheWireTypes(t *testing.T) {
	doc := openAPIDoc(t)
	schemas := mapNode(doc, "components", "schemas")
	var listed []string
	for _, typ := range wireTypes {
		listed = append(listed, typ.Name())
	}
	if declared := declaredWireTypes(t); !slices.Equal(listed, declared) {
		t.Errorf("haptic.go declares the types %v; this test lists %v", declared, listed)
	}
	if inDoc := slices.Sorted(maps.Keys(schemas)); !slices.Equal(inDoc, slices.Sorted(slices.Values(listed))) {
		t.Errorf("the document's schemas are %v; the wire types are %v", inDoc, listed)
	}

	constraints := wireConstraints(t)
	used := map[string]bool{}
	for _, typ := range wireTypes {
		want := map[string]any{"type": "object"}
		props := map[string]any{}
		var required []any
		for f := range slices.Values(reflect.VisibleFields(typ)) {
			name, omitempty := jsonName(f)
			if !f.IsExported() || name == "-" {
				continue
			}
			props[name] = expectedSchema(f.Type, typ.Name()+"."+name, !omitempty, constraints, used)
			if !omitempty {
				required = append(required, name)
			}
		}
		want["properties"] = props
		if required != nil {
			want["required"] = required
		}
		got, ok := schemas[typ.Name()]
		if !ok {
			continue // reported above
		}
		diffNodes(t, typ.Name(), checkSafeWordPatterns(t, typ.Name(), withoutDescriptions(t, got, typ.Name(), true)), want)
	}
	for at := range constraints {
		if !used[at] {
			t.Errorf("the constraint of %s names a member no wire type has", at)
		}
	}
}

// checkSafeWordPatterns replaces each pattern of n that accepts exactly
// the words SafeToken accepts by safeWordPattern, so that diffNodes
// compares what the pattern means; any other pattern stays, and fails.
func checkSafeWordPatterns(t *testing.T, at string, n any) any {
	samples := []string{"", "web", "maps/host.map", "a b", "a\tb", "a;b", "a<b", "a>b", `a\b`, "a\x7fb", "a\x00b",
		"a\nb", "é", "*.example.com", "!old", "[x]", "h2,http/1.1", "192.168.1.10", "{}", "$a"}
	switch n := n.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, v := range n {
			out[k] = checkSafeWordPatterns(t, at+"."+k, v)
		}
		if p, ok := n["pattern"].(string); ok {
			re, err := regexp.Compile(p)
			if err != nil {
				t.Errorf("%s: pattern %q: %v", at, p, err)
				return out
			}
			for _, s := range samples {
				if re.MatchString(s) != SafeToken(s) {
					t.Errorf("%s: pattern %q says %v of %q, SafeToken %v", at, p, re.MatchString(s), s, SafeToken(s))
					return out
				}
			}
			out["pattern"] = safeWordPattern
		}
		return out
	case []any:
		out := make([]any, len(n))
		for i, v := range n {
			out[i] = checkSafeWordPatterns(t, at, v)
		}
		return out
	}
	return n
}

// TestOpenAPIDocumentNamesTheAgentsRoutes: the document's paths are the
// agent's routes, its multipart parts the part names, its query parameters
// what the client sends, and its request limits the constants.
func TestOpenAPIDocumentNamesTheAgentsRoutes(t *testing.T) {
	doc := openAPIDoc(t)
	paths := mapNode(doc, "paths")
	want := []string{PathHealthz, PathReadyz, PathState, PathApply, PathPlan, "/metrics", PathDrain}
	if got := slices.Sorted(maps.Keys(paths)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("the document's paths are %v, the agent's routes %v", got, want)
	}

	apply := mapNode(paths, PathApply, "post", "requestBody")
	if got := node(apply, "x-haptic-max-bytes"); got != decimal(MaxApplyBodyBytes) {
		t.Errorf("the apply body's limit is %v, MaxApplyBodyBytes %d", got, MaxApplyBodyBytes)
	}
	form := mapNode(apply, "content", "multipart/form-data", "schema")
	if got := slices.Sorted(maps.Keys(mapNode(form, "properties"))); !slices.Equal(got, []string{PartManifest, PartPlan}) {
		t.Errorf("the apply's named parts are %v, want %s and %s", got, PartManifest, PartPlan)
	}
	for _, part := range []string{PartManifest, PartPlan} {
		if got := node(form, "properties", part, "maxLength"); got != decimal(MaxPlanBlobBytes) {
			t.Errorf("part %s is limited to %v bytes, MaxPlanBlobBytes %d", part, got, MaxPlanBlobBytes)
		}
	}
	if got := node(form, "properties", PartManifest, "contentSchema", "$ref"); got != "#/components/schemas/Manifest" {
		t.Errorf("the manifest part holds %v", got)
	}
	// A plan travels as a blob, or as a PlanPatch when its Content-Type is
	// application/json (takePlan): the plan part is either, and so is the
	// PUT body, within the same limit.
	var planForms []string
	for _, branch := range anyList(node(form, "properties", PartPlan, "anyOf")) {
		form := fmt.Sprint(node(branch, "contentMediaType"))
		if ref := node(branch, "contentSchema", "$ref"); ref != nil {
			form += " " + fmt.Sprint(ref)
		}
		planForms = append(planForms, form)
	}
	if want := []string{"application/zstd", "application/json #/components/schemas/PlanPatch"}; !slices.Equal(planForms, want) {
		t.Errorf("the plan part is one of %q, want %q", planForms, want)
	}
	for part, want := range map[string]string{PartManifest: "application/json", PartPlan: blobContentType + ", " + patchContentType} {
		if got := node(apply, "content", "multipart/form-data", "encoding", part, "contentType"); got != want {
			t.Errorf("the %s part's Content-Type is %v, want %s", part, got, want)
		}
	}
	put := mapNode(paths, PathPlan, "put", "requestBody")
	if got := node(put, "x-haptic-max-bytes"); got != decimal(MaxPlanBlobBytes) {
		t.Errorf("the PUT %s body's limit is %v, MaxPlanBlobBytes %d", PathPlan, got, MaxPlanBlobBytes)
	}
	if got := slices.Sorted(maps.Keys(mapNode(put, "content"))); !slices.Equal(got, []string{patchContentType, blobContentType}) {
		t.Errorf("the PUT %s body is one of %v, want %s or %s", PathPlan, got, blobContentType, patchContentType)
	}
	blob := mapNode(put, "content", blobContentType, "schema")
	if blob["minLength"] != "1" || blob["maxLength"] != decimal(MaxPlanBlobBytes) {
		t.Errorf("the PUT %s body is limited to %v..%v bytes, want 1..%d", PathPlan, blob["minLength"], blob["maxLength"], MaxPlanBlobBytes)
	}
	if got := node(put, "content", patchContentType, "schema", "$ref"); got != "#/components/schemas/PlanPatch" {
		t.Errorf("the PUT %s body of type %s holds %v", PathPlan, patchContentType, got)
	}

	// Every query a client sends for a state read names documented
	// parameters with documented values.
	params := map[string][]any{}
	for _, p := range node(paths, PathState, "get", "parameters").([]any) {
		params[node(p, "name").(string)], _ = node(p, "schema", "enum").([]any)
	}
	for _, read := range []StateRead{{}, {Verify: true}, {Plan: true}, {Verify: true, Plan: true}} {
		q, err := url.ParseQuery(strings.TrimPrefix(read.Query(), "?"))
		if err != nil {
			t.Fatal(err)
		}
		for name, values := range q {
			if enum, ok := params[name]; !ok || !slices.Contains(enum, any(values[0])) {
				t.Errorf("StateRead%+v sends %s=%s, which the document does not name", read, name, values[0])
			}
		}
	}

	// An error answer narrows ApplyError's stages to some of them.
	stages := textList(constGroup(t, "Stage"))
	for path, item := range paths {
		for method, op := range operations(item) {
			for code, resp := range mapNode(op, "responses") {
				for _, branch := range anyList(node(resp, "content", "application/json", "schema", "allOf")) {
					for _, s := range anyList(node(branch, "properties", "stage", "enum")) {
						if !slices.Contains(stages, s) {
							t.Errorf("%s %s %s: stage %v is no Stage* constant", method, path, code, s)
						}
					}
				}
			}
		}
	}
}

// operations are the operations of a path item by lower-case method,
// without its other members (servers).
func operations(item any) map[string]any {
	out := map[string]any{}
	for k, v := range mapNode(item) {
		if slices.Contains([]string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}, k) {
			out[k] = v
		}
	}
	return out
}

func anyList(n any) []any {
	l, _ := n.([]any)
	return l
}
