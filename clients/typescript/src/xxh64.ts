// XXH64 with seed 0, the digest of every file on the HAPTIC wire, printed
// as 16 lowercase hex digits. BigInt keeps the 64-bit arithmetic exact;
// every product and sum is cut back to 64 bits, as unsigned overflow does.

const P1 = 0x9e3779b185ebca87n;
const P2 = 0xc2b2ae3d27d4eb4fn;
const P3 = 0x165667b19e3779f9n;
const P4 = 0x85ebca77c2b2ae63n;
const P5 = 0x27d4eb2f165667c5n;
const MASK = 0xffffffffffffffffn;

const rotl = (x: bigint, r: bigint): bigint => ((x << r) | (x >> (64n - r))) & MASK;
const round = (acc: bigint, input: bigint): bigint => (rotl((acc + input * P2) & MASK, 31n) * P1) & MASK;
const merge = (acc: bigint, v: bigint): bigint => (((acc ^ round(0n, v)) * P1) + P4) & MASK;

/** The XXH64 digest of data, as the agent prints it. */
export function digest(data: Uint8Array): string {
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const n = data.length;
  let i = 0;
  let h: bigint;
  if (n >= 32) {
    let v1 = (P1 + P2) & MASK;
    let v2 = P2;
    let v3 = 0n;
    let v4 = (0n - P1) & MASK;
    for (; i + 32 <= n; i += 32) {
      v1 = round(v1, view.getBigUint64(i, true));
      v2 = round(v2, view.getBigUint64(i + 8, true));
      v3 = round(v3, view.getBigUint64(i + 16, true));
      v4 = round(v4, view.getBigUint64(i + 24, true));
    }
    h = (rotl(v1, 1n) + rotl(v2, 7n) + rotl(v3, 12n) + rotl(v4, 18n)) & MASK;
    for (const v of [v1, v2, v3, v4]) h = merge(h, v);
  } else {
    h = P5;
  }
  h = (h + BigInt(n)) & MASK;
  for (; i + 8 <= n; i += 8) {
    h ^= round(0n, view.getBigUint64(i, true));
    h = ((rotl(h, 27n) * P1) + P4) & MASK;
  }
  if (i + 4 <= n) {
    h ^= (BigInt(view.getUint32(i, true)) * P1) & MASK;
    h = ((rotl(h, 23n) * P2) + P3) & MASK;
    i += 4;
  }
  for (; i < n; i++) {
    h ^= (BigInt(data[i]!) * P5) & MASK;
    h = (rotl(h, 11n) * P1) & MASK;
  }
  h ^= h >> 33n;
  h = (h * P2) & MASK;
  h ^= h >> 29n;
  h = (h * P3) & MASK;
  h ^= h >> 32n;
  return h.toString(16).padStart(16, "0");
}
