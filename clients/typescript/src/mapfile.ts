// A map file's entries, read by the rules the agent and the Go package
// read them with: one entry per line, the key up to the first space or
// tab, the value the rest of the line trimmed; blank lines and lines that
// start with '#' hold none.

/** The entry of one line, or undefined for a blank line or a comment. */
function entryOf(line: string): { key: string; value: string } | undefined {
  const text = line.trim();
  if (text === "" || text.startsWith("#")) return undefined;
  const cut = text.search(/[ \t]/);
  if (cut < 0) return { key: text, value: "" };
  return { key: text.slice(0, cut), value: text.slice(cut + 1).trim() };
}

/**
 * The map with the entry KEY VALUE appended as a line of its own. A key the
 * map holds already is refused: HAProxy keeps both entries, and which one
 * a lookup answers is the older one, so the new value would silently not
 * take effect.
 */
export function withEntry(path: string, map: Uint8Array, key: string, value: string): Uint8Array {
  const text = new TextDecoder().decode(map);
  const lines = text.split("\n");
  const at = lines.findIndex((line) => entryOf(line)?.key === key);
  if (at >= 0) {
    throw new Error(`${path} already holds the key ${key} (line ${at + 1}: ${lines[at]!.trim()}); refusing to add it a second time`);
  }
  const separator = text === "" || text.endsWith("\n") ? "" : "\n";
  return new TextEncoder().encode(`${text}${separator}${key} ${value}\n`);
}
