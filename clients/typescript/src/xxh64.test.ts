// XXH64 against the Go package's DigestString, on inputs that take every
// branch: the empty input, the 4- and 1-byte tails, the 8-byte lanes, and
// the 32-byte stripes with and without a remainder.

import assert from "node:assert/strict";
import { test } from "node:test";
import { digest } from "./xxh64.js";

const alphabet = (n: number): Uint8Array =>
  new TextEncoder().encode(Array.from({ length: n }, (_, i) => String.fromCharCode(97 + (i % 26))).join(""));

test("digest matches DigestString", () => {
  const want: [number, string][] = [
    [0, "ef46db3751d8e999"],
    [1, "d24ec4f1a98c6e5b"],
    [3, "44bc2cf5ad770999"],
    [4, "de0327b0d25d92cc"],
    [5, "07e3670c0c8dc7eb"],
    [8, "3ad351775b4634b7"],
    [9, "27f1a34fdbb95e13"],
    [12, "4b09b7d3a233d4b3"],
    [31, "f7d421c242541ac9"],
    [32, "4da6cbe536cf55c7"],
    [33, "9ac581034b031f72"],
    [40, "32c28ae5016aa493"],
    [64, "14696b774542d718"],
    [100, "79c9fa152bb53c71"],
  ];
  for (const [n, hex] of want) assert.equal(digest(alphabet(n)), hex, `the first ${n} letters`);
});

test("digest reads a view into a larger buffer", () => {
  const whole = new TextEncoder().encode("xxabcxx");
  assert.equal(digest(whole.subarray(2, 5)), "44bc2cf5ad770999");
});
