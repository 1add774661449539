/**
 * Synthetic model repositories for the local model hub: every `org/name` (`synthetic/<name>`, and
 * any other name a rendered chart asks for, such as `meta-llama/Llama-3.1-8B-Instruct`) holds a
 * few safetensors shards and the small files a real checkpoint has (config, tokenizer, index).
 * Every byte is derived from the repository name (and revision), so the same name always serves
 * the same bytes and a file's digest is stable, without storing anything: shard bytes are an
 * AES-CTR keystream whose key is the file's identity, so any range can be produced directly.
 *
 * Revisions: "main" (and its commit) is the repository itself; any other branch or tag name, or
 * any other commit id, is a revision of its own with other bytes (a NIM profile, a pinned
 * commit). A named revision's commit is derived from the name, and asking for that commit gives
 * the same revision.
 */
import { createCipheriv, createHash } from "node:crypto";

export const SYNTHETIC_ORG = "synthetic";
const SHARDS = 4;

export interface RepoFile {
  path: string;
  size: number;
  /** Git blob id (sha1 of "blob <size>\0<bytes>"), as the Hub reports `oid`. */
  oid: string;
  /** Large files are stored in LFS on the Hub: their sha256 is the blob name clients use. */
  lfs?: { sha256: string; pointerSize: number };
}

export interface Repo {
  id: string;
  /** The commit every revision name ("main") resolves to. */
  sha: string;
  files: RepoFile[];
  totalBytes: number;
}

/** What a file is made of: literal bytes (small files) or a keystream of a given size. */
type Body = { kind: "text"; bytes: Buffer } | { kind: "stream"; key: Buffer; size: number };

interface Built extends Repo {
  bodies: Map<string, Body>;
}

const NAME_PART = /^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$/;
const REVISION = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
const COMMIT = /^[0-9a-f]{40}$/;

export function isSyntheticRepo(id: string): boolean {
  return id.startsWith(`${SYNTHETIC_ORG}/`) && isRepoId(id);
}

/** An `org/name` the Hub would accept (its client refuses `--` and `..` in ids). */
export function isRepoId(id: string): boolean {
  const parts = id.split("/");
  return (
    parts.length === 2 &&
    parts.every((p) => NAME_PART.test(p)) &&
    !id.includes("--") &&
    !id.includes("..") &&
    id.length <= 96
  );
}

export function isRevision(rev: string): boolean {
  return REVISION.test(rev) && !rev.includes("..");
}

/** The commit of "main" of a repository of this layout. */
function mainCommit(id: string, totalBytes: number): string {
  return createHash("sha1").update(`warmstart-hub-commit\0${id}\0${totalBytes}`).digest("hex");
}

/** The commit a named revision (not "main") resolves to; a commit id resolves to itself. */
export function revisionCommit(id: string, rev: string): string {
  return COMMIT.test(rev)
    ? rev
    : createHash("sha1").update(`warmstart-hub-revision\0${id}\0${rev}`).digest("hex");
}

/**
 * Layout of a repository of about `modelBytes` bytes (before digests are known). `variant` is
 * empty for "main", else the revision's commit: its bytes are keyed by it too.
 */
function layout(id: string, modelBytes: number, variant: string): Map<string, Body> {
  const name = id.slice(id.indexOf("/") + 1);
  const ident = variant ? `${id}@${variant}` : id;
  const text = (s: string): Body => ({ kind: "text", bytes: Buffer.from(s) });
  const bodies = new Map<string, Body>();
  bodies.set(
    "config.json",
    text(
      JSON.stringify(
        {
          architectures: ["SyntheticForCausalLM"],
          model_type: "synthetic",
          name_or_path: id,
          ...(variant ? { revision: variant } : {}),
          hidden_size: 4096,
          num_hidden_layers: 32,
          torch_dtype: "bfloat16",
        },
        null,
        2,
      ),
    ),
  );
  bodies.set("generation_config.json", text(JSON.stringify({ max_new_tokens: 256, temperature: 0.7 })));
  const vocab = Object.fromEntries(
    Array.from({ length: 2000 }, (_, i) => [`${name}-tok${i}`, i] as [string, number]),
  );
  bodies.set("tokenizer.json", text(JSON.stringify({ version: "1.0", model: { type: "BPE", vocab } })));
  bodies.set(
    "tokenizer_config.json",
    text(JSON.stringify({ model_max_length: 8192, tokenizer_class: "Synthetic" })),
  );
  const small = [...bodies.values()].reduce((n, b) => n + (b.kind === "text" ? b.bytes.length : 0), 0);
  const shardBytes = Math.max(1, Math.floor(Math.max(modelBytes - small - 1024, SHARDS) / SHARDS));
  const weightMap: Record<string, string> = {};
  for (let i = 1; i <= SHARDS; i++) {
    const file = `model-${String(i).padStart(5, "0")}-of-${String(SHARDS).padStart(5, "0")}.safetensors`;
    const key = createHash("sha256").update(`warmstart-hub\0${ident}\0${file}`).digest().subarray(0, 16);
    bodies.set(file, { kind: "stream", key, size: shardBytes });
    weightMap[`model.layers.${i - 1}.weight`] = file;
  }
  bodies.set(
    "model.safetensors.index.json",
    text(JSON.stringify({ metadata: { total_size: shardBytes * SHARDS }, weight_map: weightMap })),
  );
  return bodies;
}

/** `len` bytes of a keystream file starting at `offset`, as an iterator of chunks. */
export function* streamBytes(key: Buffer, offset: number, len: number, chunk = 1 << 16): Generator<Buffer> {
  const iv = Buffer.alloc(16);
  let block = BigInt(Math.floor(offset / 16));
  for (let i = 15; i >= 0; i--) {
    iv[i] = Number(block & 0xffn);
    block >>= 8n;
  }
  const cipher = createCipheriv("aes-128-ctr", key, iv);
  let skip = offset % 16;
  if (skip) cipher.update(Buffer.alloc(skip));
  skip = 0;
  const zeros = Buffer.alloc(chunk);
  for (let done = 0; done < len;) {
    const n = Math.min(chunk, len - done);
    yield cipher.update(n === chunk ? zeros : zeros.subarray(0, n));
    done += n;
  }
}

export function bodyChunks(body: Body, offset: number, len: number): Iterable<Buffer> {
  if (body.kind === "text") return [body.bytes.subarray(offset, offset + len)];
  return streamBytes(body.key, offset, len);
}

export function bodySize(body: Body): number {
  return body.kind === "text" ? body.bytes.length : body.size;
}

/**
 * A file's git and LFS digests. Hashing a multi-GB shard takes seconds: the loop yields between
 * chunks, so the hub keeps answering (its `/healthz` included) while a new name is digested.
 */
async function digests(body: Body): Promise<{ sha1: string; sha256: string }> {
  const size = bodySize(body);
  const sha1 = createHash("sha1").update(`blob ${size}\0`);
  const sha256 = createHash("sha256");
  let sinceYield = 0;
  for (const c of bodyChunks(body, 0, size)) {
    sha1.update(c);
    sha256.update(c);
    sinceYield += c.length;
    if (sinceYield >= YIELD_EVERY_BYTES) {
      sinceYield = 0;
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
  }
  return { sha1: sha1.digest("hex"), sha256: sha256.digest("hex") };
}

/** Bytes hashed between two turns of the event loop (a few milliseconds of work). */
const YIELD_EVERY_BYTES = 4 * 2 ** 20;

/** Repositories built so far (digests cost a pass over the bytes: once per name and revision). */
export class SyntheticRepos {
  /** One build per name and revision, shared by the requests that wait for it. */
  private readonly repos = new Map<string, Promise<Built>>();

  /**
   * `real`: repositories served as they are, by id, each its files' bytes by path (a real model
   * an engine loads, made at build time): "main" only, no other revision.
   */
  constructor(
    private readonly modelBytes: number,
    private readonly real: ReadonlyMap<string, ReadonlyMap<string, Buffer>> = new Map(),
  ) {}

  /**
   * A repository at a revision ("main" when not given), or undefined when the id or the revision
   * is not one the Hub could have.
   */
  async get(
    id: string,
    rev = "main",
  ): Promise<(Repo & { body(path: string): Body | undefined }) | undefined> {
    if (!isRepoId(id) || !isRevision(rev)) return undefined;
    const main = await this.build(id, "");
    if (this.real.has(id) && rev !== "main" && rev !== main.sha) return undefined;
    const repo = rev === "main" || rev === main.sha ? main : await this.build(id, revisionCommit(id, rev));
    return { ...repo, body: (path: string) => repo.bodies.get(path) };
  }

  private build(id: string, variant: string): Promise<Built> {
    const cacheKey = `${id}@${variant}`;
    let repo = this.repos.get(cacheKey);
    if (!repo) {
      repo = this.digest(id, variant);
      this.repos.set(cacheKey, repo);
    }
    return repo;
  }

  private async digest(id: string, variant: string): Promise<Built> {
    const real = this.real.get(id);
    const bodies = real
      ? new Map([...real].map(([path, bytes]) => [path, { kind: "text" as const, bytes }]))
      : layout(id, this.modelBytes, variant);
    const files: RepoFile[] = [];
    for (const [path, body] of [...bodies].sort(([a], [b]) => a.localeCompare(b))) {
      const d = await digests(body);
      const size = bodySize(body);
      files.push({
        path,
        size,
        oid: d.sha1,
        // Weights are LFS files on the Hub, whatever their size.
        ...(body.kind === "stream" || path.endsWith(".safetensors")
          ? { lfs: { sha256: d.sha256, pointerSize: 134 } }
          : {}),
      });
    }
    const totalBytes = files.reduce((n, f) => n + f.size, 0);
    const sha = variant || mainCommit(id, totalBytes);
    return { id, sha, files, totalBytes, bodies };
  }
}
