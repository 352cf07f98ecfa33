// A validator for the JSON Schema keywords api/openapi.yaml uses, so that
// the tests can hold every answer of the agent to the document without a
// dependency. Schemas are the nodes the YAML subset reader returns, whose
// scalars are all strings: the keywords that hold numbers or booleans are
// read as such here. A keyword the validator does not know is an error,
// never skipped, so the document cannot say more than the tests check.

package haptic

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/haptic-agent/haptic/internal/yamlsubset"
)

// annotationKeywords say something to a reader and constrain nothing.
var annotationKeywords = map[string]bool{
	"description": true, "title": true, "examples": true, "deprecated": true,
	"readOnly": true, "writeOnly": true, "default": true,
}

// schemaCheck validates values against the schemas of one document.
type schemaCheck struct {
	doc map[string]any // for "#/..." references
	// strict refuses an object member that no schema declares where the
	// schema says nothing about other members: the agent's answers must
	// hold exactly what the document names, though a reader of the wire
	// ignores members it does not know.
	strict bool
}

// validateJSON decodes body (one JSON value, numbers kept exact) and
// validates it against schema.
func (c *schemaCheck) validateJSON(schema any, body []byte) []string {
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return []string{"not JSON: " + err.Error()}
	}
	if d.More() {
		return []string{"more than one JSON value"}
	}
	return c.validate(schema, v, "", c.strict)
}

// resolve follows $ref until a schema without one; a schema with a $ref
// and other keywords keeps them (OpenAPI 3.1 allows a description beside a
// reference), so they are merged with the target's, the local ones first.
func (c *schemaCheck) resolve(schema any) (map[string]any, error) {
	s, ok := schema.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("schema %v is not an object", schema)
	}
	for range 32 {
		ref, ok := s["$ref"].(string)
		if !ok {
			return s, nil
		}
		target, err := pointer(c.doc, ref)
		if err != nil {
			return nil, err
		}
		t, ok := target.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s is not a schema", ref)
		}
		merged := maps.Clone(t)
		for k, v := range s {
			if k != "$ref" {
				merged[k] = v
			}
		}
		s = merged
	}
	return nil, fmt.Errorf("references nest too deep")
}

// pointer follows a local reference "#/a/b~1c" in doc.
func pointer(doc any, ref string) (any, error) {
	if !strings.HasPrefix(ref, "#/") {
		return nil, fmt.Errorf("reference %q is not local", ref)
	}
	node := doc
	for _, tok := range strings.Split(ref[2:], "/") {
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		m, ok := node.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("reference %q: %q is not in an object", ref, tok)
		}
		if node, ok = m[tok]; !ok {
			return nil, fmt.Errorf("reference %q: no %q", ref, tok)
		}
	}
	return node, nil
}

// validate checks v against schema and returns one message per failure,
// each starting with where in v it is. strictHere applies strict to v
// itself (not to its members): the branches of an allOf each declare part
// of an object, so only the allOf as a whole can tell a member undeclared.
func (c *schemaCheck) validate(schema any, v any, at string, strictHere bool) []string {
	s, err := c.resolve(schema)
	if err != nil {
		return []string{at + ": " + err.Error()}
	}
	var errs []string
	fail := func(format string, args ...any) { errs = append(errs, at+": "+fmt.Sprintf(format, args...)) }
	for _, kw := range slices.Sorted(maps.Keys(s)) {
		arg := s[kw]
		switch kw {
		case "type":
			if !slices.ContainsFunc(stringsOf(arg), func(t string) bool { return hasJSONType(v, t) }) {
				fail("%s is not of type %v", brief(v), arg)
			}
		case "enum":
			if !slices.ContainsFunc(stringsOf(arg), func(e string) bool { return scalarIs(v, e) }) {
				fail("%s is not one of %v", brief(v), arg)
			}
		case "const":
			if !scalarIs(v, arg.(string)) {
				fail("%s is not %q", brief(v), arg)
			}
		case "properties":
			obj, _ := v.(map[string]any)
			props, _ := arg.(map[string]any)
			for _, name := range slices.Sorted(maps.Keys(props)) {
				if member, ok := obj[name]; ok {
					errs = append(errs, c.validate(props[name], member, at+"/"+name, c.strict)...)
				}
			}
		case "required":
			if obj, ok := v.(map[string]any); ok {
				for _, name := range stringsOf(arg) {
					if _, ok := obj[name]; !ok {
						fail("required member %q is missing", name)
					}
				}
			}
		case "additionalProperties":
			obj, _ := v.(map[string]any)
			props, _ := s["properties"].(map[string]any)
			for _, name := range slices.Sorted(maps.Keys(obj)) {
				if _, declared := props[name]; declared {
					continue
				}
				switch arg {
				case "true":
				case "false":
					fail("member %q is not allowed", name)
				default:
					errs = append(errs, c.validate(arg, obj[name], at+"/"+name, c.strict)...)
				}
			}
		case "items":
			list, _ := v.([]any)
			for i, item := range list {
				errs = append(errs, c.validate(arg, item, at+"/"+strconv.Itoa(i), c.strict)...)
			}
		case "maxLength", "minLength":
			if str, ok := v.(string); ok {
				checkBound(kw, arg, int64(utf8.RuneCountInString(str)), "characters", fail)
			}
		case "maxItems", "minItems":
			if list, ok := v.([]any); ok {
				checkBound(kw, arg, int64(len(list)), "items", fail)
			}
		case "maxProperties", "minProperties":
			if obj, ok := v.(map[string]any); ok {
				checkBound(kw, arg, int64(len(obj)), "members", fail)
			}
		case "maximum", "minimum":
			if n, ok := v.(json.Number); ok {
				checkNumber(kw, arg, n, fail)
			}
		case "pattern":
			if str, ok := v.(string); ok {
				re, err := regexp.Compile(arg.(string))
				if err != nil {
					fail("pattern %q: %v", arg, err)
				} else if !re.MatchString(str) {
					fail("%s does not match %s", brief(v), arg)
				}
			}
		case "format":
			checkFormat(arg.(string), v, fail)
		case "contentEncoding":
			if str, ok := v.(string); ok && arg == "base64" {
				if _, err := base64.StdEncoding.DecodeString(str); err != nil {
					fail("not base64: %v", err)
				}
			}
		case "contentMediaType":
		case "contentSchema":
			if str, ok := v.(string); ok && s["contentMediaType"] == "application/json" {
				errs = append(errs, prefixed(at, c.validateJSON(arg, []byte(str)))...)
			}
		case "allOf":
			for _, sub := range arg.([]any) {
				errs = append(errs, c.validate(sub, v, at, false)...)
			}
		case "anyOf", "oneOf":
			matched := 0
			var branchErrs []string
			for i, sub := range arg.([]any) {
				e := c.validate(sub, v, at, strictHere)
				if len(e) == 0 {
					matched++
				}
				branchErrs = append(branchErrs, prefixed(fmt.Sprintf("(branch %d)", i), e)...)
			}
			if matched == 0 || kw == "oneOf" && matched > 1 {
				fail("%d branches of %s match: %s", matched, kw, strings.Join(branchErrs, "; "))
			}
		default:
			if !annotationKeywords[kw] && !strings.HasPrefix(kw, "x-") {
				fail("the validator does not know the keyword %q", kw)
			}
		}
	}
	// Only a schema that names members can tell one undeclared; a oneOf's
	// branches each do so themselves.
	_, names := s["properties"]
	_, parts := s["allOf"]
	if obj, ok := v.(map[string]any); ok && strictHere && (names || parts) && s["additionalProperties"] == nil {
		declared := c.declared(s)
		for _, name := range slices.Sorted(maps.Keys(obj)) {
			if !declared[name] {
				fail("member %q is not in the document", name)
			}
		}
	}
	return errs
}

// declared is the set of member names a schema and the allOf branches under
// it name.
func (c *schemaCheck) declared(s map[string]any) map[string]bool {
	out := map[string]bool{}
	props, _ := s["properties"].(map[string]any)
	for name := range props {
		out[name] = true
	}
	branches, _ := s["allOf"].([]any)
	for _, b := range branches {
		if r, err := c.resolve(b); err == nil {
			maps.Copy(out, c.declared(r))
		}
	}
	return out
}

func prefixed(at string, errs []string) []string {
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = at + " " + e
	}
	return out
}

// stringsOf reads a keyword that is a string or a list of strings.
func stringsOf(arg any) []string {
	switch a := arg.(type) {
	case string:
		return []string{a}
	case []any:
		out := make([]string, 0, len(a))
		for _, e := range a {
			s, _ := e.(string)
			out = append(out, s)
		}
		return out
	}
	return nil
}

// hasJSONType reports whether v is of the JSON Schema type t. An integer
// is a number written without a fraction or an exponent, as Go's encoder
// writes every integer.
func hasJSONType(v any, t string) bool {
	switch v := v.(type) {
	case nil:
		return t == "null"
	case bool:
		return t == "boolean"
	case string:
		return t == "string"
	case json.Number:
		return t == "number" || t == "integer" && !strings.ContainsAny(v.String(), ".eE")
	case []any:
		return t == "array"
	case map[string]any:
		return t == "object"
	}
	return false
}

// scalarIs compares a JSON scalar with a document scalar, which the YAML
// reader gives as text: a string by its value, a number or a boolean by
// its JSON spelling. The type keyword beside it tells "1" from 1.
func scalarIs(v any, doc string) bool {
	switch v := v.(type) {
	case string:
		return v == doc
	case json.Number:
		return v.String() == doc
	case bool:
		return strconv.FormatBool(v) == doc
	}
	return false
}

func checkBound(kw string, arg any, n int64, unit string, fail func(string, ...any)) {
	limit, err := strconv.ParseInt(arg.(string), 10, 64)
	switch {
	case err != nil:
		fail("%s %q is not an integer", kw, arg)
	case strings.HasPrefix(kw, "max") && n > limit:
		fail("%d %s exceed %s %d", n, unit, kw, limit)
	case strings.HasPrefix(kw, "min") && n < limit:
		fail("%d %s are below %s %d", n, unit, kw, limit)
	}
}

// checkNumber compares integers exactly, so that a uint64 near its top is
// not rounded into a float.
func checkNumber(kw string, arg any, n json.Number, fail func(string, ...any)) {
	limit, err1 := strconv.ParseInt(arg.(string), 10, 64)
	got, err2 := strconv.ParseInt(n.String(), 10, 64)
	switch {
	case err1 != nil:
		fail("%s %q is not an integer", kw, arg)
	case err2 != nil:
		fail("%s is not an integer within int64, which %s bounds here", n, kw)
	case kw == "maximum" && got > limit:
		fail("%d exceeds the maximum %d", got, limit)
	case kw == "minimum" && got < limit:
		fail("%d is below the minimum %d", got, limit)
	}
}

// checkFormat checks the formats the document uses: the integer widths of
// Go's types and RFC 3339 times.
func checkFormat(format string, v any, fail func(string, ...any)) {
	n, isNumber := v.(json.Number)
	str, isString := v.(string)
	switch format {
	case "int64":
		if _, err := strconv.ParseInt(n.String(), 10, 64); isNumber && err != nil {
			fail("%s is not an int64", n)
		}
	case "uint64":
		if _, err := strconv.ParseUint(n.String(), 10, 64); isNumber && err != nil {
			fail("%s is not a uint64", n)
		}
	case "date-time":
		if _, err := time.Parse(time.RFC3339Nano, str); isString && err != nil {
			fail("%q is not an RFC 3339 time: %v", str, err)
		}
	default:
		fail("the validator does not know the format %q", format)
	}
}

// brief is v for a message, cut short.
func brief(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 80 {
		return string(b[:77]) + "..."
	}
	return string(b)
}

func TestSchemaValidator(t *testing.T) {
	doc, err := yamlsubset.Parse(`components:
  schemas:
    Thing:
      description: an object of two members
      type: object
      required: [name, count]
      properties:
        name:
          type: string
          maxLength: "3"
          pattern: '^[a-z]+$'
        count:
          type: integer
          format: uint64
          maximum: "10"
        kind:
          enum: [a, b]
        tags:
          type: [array, "null"]
          maxItems: "2"
          items:
            type: string
        at:
          type: string
          format: date-time
        blob:
          type: string
          contentEncoding: base64
        byName:
          type: object
          additionalProperties:
            type: integer
    Narrowed:
      allOf:
        - $ref: "#/components/schemas/Thing"
        - properties:
            kind:
              enum: [b]
    Either:
      oneOf:
        - $ref: "#/components/schemas/Thing"
        - type: object
          required: [missing]
          properties:
            missing:
              type: array
    Manifest:
      type: string
      contentMediaType: application/json
      contentSchema:
        $ref: "#/components/schemas/Thing"
    Odd:
      type: string
      unknownKeyword: x
`)
	if err != nil {
		t.Fatal(err)
	}
	c := &schemaCheck{doc: doc.(map[string]any), strict: true}
	ref := func(name string) any { return map[string]any{"$ref": "#/components/schemas/" + name} }
	tests := []struct {
		schema, body string
		want         string // a part of one of the messages; "" = valid
	}{
		{"Thing", `{"name":"ab","count":3}`, ""},
		{"Thing", `{"name":"ab","count":3,"tags":null,"kind":"a","at":"2026-01-02T03:04:05.5Z","blob":"AAE=","byName":{"x":1}}`, ""},
		{"Thing", `{"name":"ab"}`, `required member "count" is missing`},
		{"Thing", `{"name":"abcd","count":1}`, "4 characters exceed maxLength 3"},
		{"Thing", `{"name":"A","count":1}`, `"A" does not match`},
		{"Thing", `{"name":"a","count":11}`, "11 exceeds the maximum 10"},
		{"Thing", `{"name":"a","count":1.5}`, "is not of type integer"},
		{"Thing", `{"name":"a","count":-1}`, "-1 is not a uint64"},
		{"Thing", `{"name":"a","count":1,"kind":"c"}`, `"c" is not one of [a b]`},
		{"Thing", `{"name":"a","count":1,"tags":["x","y","z"]}`, "3 items exceed maxItems 2"},
		{"Thing", `{"name":"a","count":1,"tags":[1]}`, "/tags/0: 1 is not of type string"},
		{"Thing", `{"name":"a","count":1,"at":"yesterday"}`, "not an RFC 3339 time"},
		{"Thing", `{"name":"a","count":1,"blob":"!"}`, "not base64"},
		{"Thing", `{"name":"a","count":1,"byName":{"x":"y"}}`, "/byName/x"},
		{"Thing", `{"name":"a","count":1,"extra":true}`, `member "extra" is not in the document`},
		{"Narrowed", `{"name":"a","count":1,"kind":"b"}`, ""},
		{"Narrowed", `{"name":"a","count":1,"kind":"a"}`, `"a" is not one of [b]`},
		{"Narrowed", `{"name":"a","count":1,"extra":1}`, `member "extra" is not in the document`},
		{"Either", `{"missing":[]}`, ""},
		{"Either", `{"name":"a","count":1}`, ""},
		{"Either", `{"other":1}`, "0 branches of oneOf match"},
		{"Manifest", `"{\"name\":\"a\",\"count\":1}"`, ""},
		{"Manifest", `"{\"name\":\"a\"}"`, `required member "count" is missing`},
		{"Odd", `"x"`, `does not know the keyword "unknownKeyword"`},
		{"Thing", `{} {}`, "more than one JSON value"},
	}
	for _, tc := range tests {
		errs := c.validateJSON(ref(tc.schema), []byte(tc.body))
		switch {
		case tc.want == "" && len(errs) > 0:
			t.Errorf("%s %s: %v", tc.schema, tc.body, errs)
		case tc.want != "" && !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, tc.want) }):
			t.Errorf("%s %s: got %v, want a message with %q", tc.schema, tc.body, errs, tc.want)
		}
	}
}
