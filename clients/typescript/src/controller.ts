// A controller of one HAPTIC agent in TypeScript, written from
// api/openapi.yaml alone: every wire type below comes from the types
// openapi-typescript generates from the document (src/agent-api.d.ts).
//
//   node dist/controller.js AGENT_URL DIR MAP KEY VALUE
//
// It reads the agent's state, lands the files of DIR with a reload, then
// adds the entry KEY VALUE to the map file MAP (a path in DIR) at runtime,
// with no reload, and reads the state again to see both land. A KEY the map
// holds already is refused before anything is sent. Credentials
// come from HAPTIC_AGENT_USER and HAPTIC_AGENT_PASS, as for `haptic push`.
// It exits 1 on any answer it did not expect.

import { readdir, readFile } from "node:fs/promises";
import { join, relative, sep } from "node:path";
import type { components, paths } from "./agent-api.js";
import { withEntry } from "./mapfile.js";
import { digest } from "./xxh64.js";

type Schemas = components["schemas"];
type State = Schemas["State"];
type Manifest = Schemas["Manifest"];
type ManifestFile = Schemas["ManifestFile"];
type Op = Schemas["Op"];
type ApplyResult = Schemas["ApplyResult"];
type Conflict = Schemas["Conflict"];
type Missing = Schemas["Missing"];
type ApplyError = Schemas["ApplyError"];
// The answers of POST /v1/apply, by status, as the document lists them.
type ApplyAnswers = paths["/v1/apply"]["post"]["responses"];
type Answer409 = ApplyAnswers[409]["content"]["application/json"];

/** The desired files: path (as the manifest names it) to bytes. */
type FileSet = Map<string, Uint8Array>;

class Agent {
  constructor(
    private readonly base: string,
    private readonly auth: string,
  ) {}

  private async request(method: string, path: string, body?: FormData): Promise<Response> {
    const init: RequestInit = { method, headers: { Authorization: this.auth } };
    if (body !== undefined) init.body = body;
    return fetch(this.base + path, init);
  }

  /** GET /v1/state?plan=0: the state, without the plan blob. */
  async state(): Promise<State> {
    const res = await this.request("GET", "/v1/state?plan=0");
    if (res.status !== 200) throw new Error(`GET /v1/state: ${res.status} ${await res.text()}`);
    return (await res.json()) as State;
  }

  /**
   * POST /v1/apply: the manifest first, then the parts of the files the
   * agent does not hold. A 409 Missing names the parts it lacks after
   * all, and they are sent once more; a Conflict or an error fails.
   */
  async apply(manifest: Manifest, files: FileSet, held: Set<string>): Promise<ApplyResult> {
    let send = (manifest.files ?? []).map((f) => f.path).filter((p) => !held.has(p));
    for (let attempt = 0; attempt < 2; attempt++) {
      const form = new FormData();
      form.append("manifest", new Blob([JSON.stringify(manifest)], { type: "application/json" }), "manifest.json");
      for (const path of send) {
        form.append(path, new Blob([files.get(path)!], { type: "application/octet-stream" }), path);
      }
      const res = await this.request("POST", "/v1/apply", form);
      const text = await res.text();
      if (res.status === 200) return JSON.parse(text) as ApplyResult;
      if (res.status === 409) {
        const answer = JSON.parse(text) as Answer409;
        if ("missing" in answer) {
          send = (answer as Missing).missing ?? [];
          continue;
        }
        throw new Error(`apply ${manifest.plan_id} fenced: ${(answer as Conflict).reason}`);
      }
      const error = res.headers.get("Content-Type") === "application/json" ? (JSON.parse(text) as ApplyError) : undefined;
      throw new Error(`apply ${manifest.plan_id}: ${res.status} ${error ? `${error.stage}: ${error.message}` : text}`);
    }
    throw new Error(`apply ${manifest.plan_id}: the agent still lacks parts after they were sent`);
  }
}

/** Every regular file under dir, by its slash-separated path. */
async function readTree(dir: string): Promise<FileSet> {
  const files: FileSet = new Map();
  for (const entry of await readdir(dir, { recursive: true, withFileTypes: true })) {
    if (!entry.isFile()) continue;
    const abs = join(entry.parentPath, entry.name);
    files.set(relative(dir, abs).split(sep).join("/"), new Uint8Array(await readFile(abs)));
  }
  return files;
}

function kindOf(path: string): ManifestFile["kind"] {
  if (path === "haproxy.cfg") return "config";
  if (path.endsWith(".map")) return "map";
  return "general";
}

/**
 * The manifest entries of files. The proof is the controller's own
 * witness; a digest of the content serves, as it does for the Go client.
 */
function manifestFiles(files: FileSet): ManifestFile[] {
  return [...files.keys()].sort().map((path) => {
    const d = digest(files.get(path)!);
    return { path, digest: d, proof: `ts:${d}`, size: files.get(path)!.length, kind: kindOf(path), reload_on_change: path === "haproxy.cfg" };
  });
}

/** A plan id for a file set: the digest of its paths and digests. */
function planIdOf(entries: ManifestFile[]): string {
  return digest(new TextEncoder().encode(entries.map((f) => `${f.path} ${f.digest}\n`).join("")));
}

/**
 * The files the agent holds already: those whose record has the same
 * non-empty proof, digest and size as the manifest entry.
 */
function heldFiles(state: State, entries: ManifestFile[]): Set<string> {
  const held = new Set<string>();
  for (const f of entries) {
    const at = state.files?.[f.path];
    if (at && f.proof && at.proof === f.proof && at.digest === f.digest && at.size === f.size) held.add(f.path);
  }
  return held;
}

/**
 * A manifest composed against state: its token follows the applied one,
 * and it quotes the applied pair and token, and the worker-ops pair that
 * lets an auto apply run ops.
 */
function manifestFor(state: State, entries: ManifestFile[], mode: Manifest["mode"], ops: Op[] = []): Manifest {
  const m: Manifest = {
    identity_version: 1,
    plan_id: planIdOf(entries),
    plan_schema_version: 1,
    token: { leader_epoch: Math.max(1, state.applied_token.leader_epoch), render_seq: state.applied_token.render_seq + 1 },
    expected_prev_plan_id: state.applied_plan_id,
    expected_prev_token: state.applied_token,
    files: entries,
    mode,
  };
  if (state.applied_plan_proof) m.expected_prev_plan_proof = state.applied_plan_proof;
  if (state.worker_ops_plan_id) m.expected_worker_ops_plan_id = state.worker_ops_plan_id;
  if (state.worker_ops_plan_proof) m.expected_worker_ops_plan_proof = state.worker_ops_plan_proof;
  if (ops.length > 0) m.ops = ops;
  return m;
}

function expectOK(what: string, result: ApplyResult, mode: ApplyResult["mode"]): void {
  const ops = (result.op_results ?? []).map((r) => `${r.kind}=${r.ok}`).join(" ");
  console.log(`${what}: plan ${result.plan_id}, mode ${result.mode}${ops ? `, ops ${ops}` : ""}`);
  if (!result.ok || result.mode !== mode || (result.op_results ?? []).some((r) => !r.ok)) {
    throw new Error(`${what}: want an ACK of mode ${mode}, got ${JSON.stringify(result)}`);
  }
}

async function main(args: string[]): Promise<void> {
  const [url, dir, mapPath, key, value] = args;
  if (!url || !dir || !mapPath || !key || value === undefined) {
    throw new Error("usage: controller AGENT_URL DIR MAP KEY VALUE");
  }
  const user = process.env.HAPTIC_AGENT_USER ?? "admin";
  const pass = process.env.HAPTIC_AGENT_PASS ?? "admin";
  const agent = new Agent(url.replace(/\/$/, ""), "Basic " + Buffer.from(`${user}:${pass}`).toString("base64"));

  let state = await agent.state();
  if (state.api_version !== 1 || !(state.agent_ops ?? []).includes("map_add")) {
    throw new Error(`the agent speaks API ${state.api_version} with ops ${state.agent_ops}`);
  }
  console.log(`agent ${state.agent_version}, HAProxy ${state.haproxy.version}, generation ${state.generation}`);

  // The directory, landed by a reload.
  const files = await readTree(dir);
  if (!files.has(mapPath)) throw new Error(`${dir} holds no ${mapPath}`);
  // A key the map holds already is refused before anything is sent.
  const grown = withEntry(mapPath, files.get(mapPath)!, key, value);
  let entries = manifestFiles(files);
  expectOK("reload", await agent.apply(manifestFor(state, entries, "reload"), files, heldFiles(state, entries)), "reload");

  // One map entry at runtime: only the map travels, the op runs on the
  // worker, and nothing reloads.
  state = await agent.state();
  files.set(mapPath, grown);
  entries = manifestFiles(files);
  const op: Op = { kind: "map_add", path: mapPath, key, value };
  const runtime = manifestFor(state, entries, "auto", [op]);
  expectOK("runtime", await agent.apply(runtime, files, heldFiles(state, entries)), "runtime");

  state = await agent.state();
  const held = state.files?.[mapPath];
  if (state.worker_ops_plan_id !== runtime.plan_id || held?.digest !== digest(grown)) {
    throw new Error(`the state after the runtime apply: worker plan ${state.worker_ops_plan_id}, ${mapPath} ${JSON.stringify(held)}`);
  }
  console.log(`state: generation ${state.generation}, the worker holds plan ${state.worker_ops_plan_id}`);
}

main(process.argv.slice(2)).catch((err: unknown) => {
  console.error(`controller: ${err instanceof Error ? err.message : String(err)}`);
  process.exit(1);
});
