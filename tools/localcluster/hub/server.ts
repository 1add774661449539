/**
 * The local model hub: synthetic repositories (any `org/name`, at any revision), and real ones
 * read from folders (`--repo ID=DIR`), served over the part of the Hugging Face Hub HTTP
 * API that `huggingface_hub`'s `snapshot_download` uses (revision info, tree listing, HEAD and
 * GET of `resolve` URLs with the commit, etag and size headers it reads), at one bandwidth shared
 * by every client, counting what it served per repository and per client. Clients name
 * themselves in the user agent (`client/<id>`); others count under their address.
 */
import { once } from "node:events";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { setTimeout as sleep } from "node:timers/promises";
import { bodyChunks, bodySize, isRepoId, SyntheticRepos } from "./synthetic.js";

export interface HubOptions {
  /** Size of every synthetic repository, in bytes. */
  modelBytes: number;
  /** Bandwidth shared by all clients, bytes per second (0: unthrottled). */
  bytesPerSecond: number;
  /** Real repositories served as they are: id to its files' bytes by path. */
  real?: ReadonlyMap<string, ReadonlyMap<string, Buffer>>;
}

export interface Counter {
  bytes: number;
  requests: number;
}

export interface HubStats extends Counter {
  repos: Record<string, Counter>;
  clients: Record<string, Counter>;
}

/**
 * One bandwidth for everyone: each chunk reserves the next free slot of the link, so N
 * concurrent downloads each get about 1/N of it, as on a shared uplink.
 */
export class SharedLink {
  private nextFree = 0;

  constructor(private readonly bytesPerSecond: number) {}

  async take(bytes: number, signal?: AbortSignal): Promise<void> {
    if (this.bytesPerSecond <= 0) return;
    const now = performance.now();
    const start = Math.max(now, this.nextFree);
    this.nextFree = start + (bytes / this.bytesPerSecond) * 1000;
    const wait = this.nextFree - now;
    if (wait > 1) await sleep(wait, undefined, signal ? { signal } : undefined);
  }
}

export class ModelHub {
  readonly repos: SyntheticRepos;
  private readonly link: SharedLink;
  private readonly stats: HubStats = { bytes: 0, requests: 0, repos: {}, clients: {} };

  constructor(opts: HubOptions) {
    this.repos = new SyntheticRepos(opts.modelBytes, opts.real);
    this.link = new SharedLink(opts.bytesPerSecond);
  }

  snapshot(): HubStats {
    return structuredClone(this.stats);
  }

  listen(port: number, host = "127.0.0.1"): Promise<Server> {
    const server = createServer((req, res) => {
      this.handle(req, res).catch((err: unknown) => {
        if (!res.headersSent) json(res, 500, { error: (err as Error).message });
        else res.destroy();
      });
    });
    return new Promise((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, host, () => resolve(server));
    });
  }

  private count(repo: string | undefined, client: string, bytes: number, request: boolean): void {
    const add = (c: Counter): void => {
      c.bytes += bytes;
      if (request) c.requests += 1;
    };
    add(this.stats);
    add((this.stats.clients[client] ??= { bytes: 0, requests: 0 }));
    if (repo) add((this.stats.repos[repo] ??= { bytes: 0, requests: 0 }));
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? "/", "http://hub");
    const path = decodeURIComponent(url.pathname);
    const client = clientOf(req);
    if (path === "/_stats" && req.method === "GET") return json(res, 200, this.snapshot());
    if (path === "/healthz") return json(res, 200, { ok: true });

    let m = /^\/api\/models\/([^/]+\/[^/]+)\/revision\/([^/]+)$/.exec(path);
    if (m && req.method === "GET") {
      const repo = await this.resolve(res, m[1]!, m[2]!);
      if (!repo) return;
      this.count(repo.id, client, 0, true);
      return json(res, 200, {
        id: repo.id,
        modelId: repo.id,
        sha: repo.sha,
        private: false,
        gated: false,
        disabled: false,
        tags: ["synthetic"],
        siblings: repo.files.map((f) => ({ rfilename: f.path })),
      });
    }
    m = /^\/api\/models\/([^/]+\/[^/]+)\/tree\/([^/]+)(\/.*)?$/.exec(path);
    if (m && req.method === "GET") {
      const repo = await this.resolve(res, m[1]!, m[2]!);
      if (!repo) return;
      this.count(repo.id, client, 0, true);
      const under = (m[3] ?? "").replace(/^\/+|\/+$/g, "");
      return json(
        res,
        200,
        repo.files
          .filter((f) => !under || f.path.startsWith(`${under}/`))
          .map((f) => ({
            type: "file",
            path: f.path,
            size: f.size,
            oid: f.oid,
            ...(f.lfs ? { lfs: { oid: f.lfs.sha256, size: f.size, pointerSize: f.lfs.pointerSize } } : {}),
          })),
      );
    }
    m = /^\/([^/]+\/[^/]+)\/resolve\/([^/]+)\/(.+)$/.exec(path);
    if (m && (req.method === "GET" || req.method === "HEAD")) {
      const repo = await this.resolve(res, m[1]!, m[2]!);
      if (!repo) return;
      const file = repo.files.find((f) => f.path === m[3]);
      const body = file && repo.body(file.path);
      if (!file || !body) {
        res.setHeader("X-Error-Code", "EntryNotFound");
        return json(res, 404, { error: `${file ? "" : "no "}file ${m[3]} in ${repo.id}` });
      }
      const size = bodySize(body);
      const range = parseRange(req.headers.range, size);
      const etag = `"${file.lfs?.sha256 ?? file.oid}"`;
      res.setHeader("X-Repo-Commit", repo.sha);
      res.setHeader("ETag", etag);
      if (file.lfs) {
        res.setHeader("X-Linked-Etag", etag);
        res.setHeader("X-Linked-Size", String(size));
      }
      res.setHeader("Accept-Ranges", "bytes");
      res.setHeader("Content-Type", "application/octet-stream");
      if (range) res.setHeader("Content-Range", `bytes ${range.start}-${range.end - 1}/${size}`);
      res.setHeader("Content-Length", String(range ? range.end - range.start : size));
      res.writeHead(range ? 206 : 200);
      this.count(repo.id, client, 0, true);
      if (req.method === "HEAD") return void res.end();
      await this.send(
        res,
        repo.id,
        client,
        bodyChunks(body, range?.start ?? 0, range ? range.end - range.start : size),
      );
      return;
    }
    json(res, 404, { error: `no route for ${req.method} ${path}` });
  }

  /** The repository at a revision (every `org/name` and revision name exists), else a Hub-style 404. */
  private async resolve(res: ServerResponse, id: string, rev: string) {
    if (!isRepoId(id)) {
      res.setHeader("X-Error-Code", "RepoNotFound");
      json(res, 404, { error: `repository ${id} not found (the local hub serves any org/name)` });
      return undefined;
    }
    const repo = await this.repos.get(id, rev);
    if (!repo) {
      res.setHeader("X-Error-Code", "RevisionNotFound");
      json(res, 404, { error: `revision ${rev} not found in ${id}` });
      return undefined;
    }
    return repo;
  }

  private async send(
    res: ServerResponse,
    repo: string,
    client: string,
    chunks: Iterable<Buffer>,
  ): Promise<void> {
    const aborted = new AbortController();
    res.once("close", () => aborted.abort());
    try {
      for (const chunk of chunks) {
        await this.link.take(chunk.length, aborted.signal);
        if (!res.write(chunk)) await once(res, "drain", { signal: aborted.signal });
        if (aborted.signal.aborted) return;
        this.count(repo, client, chunk.length, false);
      }
      res.end();
    } catch (err) {
      if (!aborted.signal.aborted) throw err;
    }
  }
}

function clientOf(req: IncomingMessage): string {
  const ua = req.headers["user-agent"] ?? "";
  const m = /(?:^|[;\s])client\/([A-Za-z0-9._-]{1,128})/.exec(ua);
  return m ? m[1]! : (req.socket.remoteAddress ?? "unknown");
}

function parseRange(header: string | undefined, size: number): { start: number; end: number } | undefined {
  const m = header && /^bytes=(\d+)-(\d*)$/.exec(header.trim());
  if (!m) return undefined;
  const start = Number(m[1]);
  const end = m[2] ? Math.min(Number(m[2]) + 1, size) : size;
  return start < end ? { start, end } : undefined;
}

function json(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(text) });
  res.end(text);
}
