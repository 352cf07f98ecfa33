// The map edit of the controller: an entry is appended as a line of its
// own, and a key the map holds already is refused with the line that holds
// it.

import assert from "node:assert/strict";
import { test } from "node:test";
import { withEntry } from "./mapfile.js";

const bytes = (s: string): Uint8Array => new TextEncoder().encode(s);
const text = (b: Uint8Array): string => new TextDecoder().decode(b);

test("withEntry appends a new key", () => {
  assert.equal(text(withEntry("maps/host.map", bytes("shop.example.com shop\n"), "news.example.com", "blog")),
    "shop.example.com shop\nnews.example.com blog\n");
  assert.equal(text(withEntry("maps/host.map", bytes("shop.example.com shop"), "news.example.com", "blog")),
    "shop.example.com shop\nnews.example.com blog\n");
  assert.equal(text(withEntry("maps/host.map", bytes(""), "news.example.com", "blog")), "news.example.com blog\n");
  // A comment or a longer key that starts with KEY is no entry for KEY.
  assert.equal(text(withEntry("maps/host.map", bytes("# blog.example.com old\nblog.example.com.au au\n"), "blog.example.com", "blog")),
    "# blog.example.com old\nblog.example.com.au au\nblog.example.com blog\n");
});

test("withEntry refuses a key the map holds", () => {
  const map = bytes("shop.example.com shop\n  blog.example.com\tblog\n");
  assert.throws(() => withEntry("maps/host.map", map, "blog.example.com", "web-servers"), {
    message: "maps/host.map already holds the key blog.example.com (line 2: blog.example.com\tblog); refusing to add it a second time",
  });
  assert.throws(() => withEntry("maps/host.map", bytes("solo\n"), "solo", "x"), /already holds the key solo \(line 1: solo\)/);
});
