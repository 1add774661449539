/**
 * Mounts for the `store.warmstart.dev` driver, with the system's `mount` and `umount` (util-linux,
 * in every node agent image): a bind of one folder made read-only, its removal, and what is
 * mounted at a path as this process's mount namespace sees it (`/proc/self/mountinfo`).
 */
import { execFile } from "node:child_process";
import { readFile, realpath, stat } from "node:fs/promises";
import { promisify } from "node:util";

const exec = promisify(execFile);
/**
 * A mount or unmount that hangs (a wedged file system) fails the call after this long, and the
 * kubelet retries. The child is killed, but one stuck in the kernel may never exit: the call does
 * not wait for it.
 */
const MOUNT_TIMEOUT_MS = 60_000;
async function run(cmd: string, args: string[]): Promise<void> {
  const child = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      child.abort();
      reject(new Error(`${cmd} ${args.join(" ")}: no answer in ${MOUNT_TIMEOUT_MS / 1000} s`));
    }, MOUNT_TIMEOUT_MS);
  });
  try {
    await Promise.race([exec(cmd, args, { signal: child.signal, killSignal: "SIGKILL" }), timedOut]);
  } finally {
    clearTimeout(timer);
  }
}

/** The flags every publish ends with: MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV. */
export const READ_ONLY_BIND = "remount,bind,ro,nosuid,nodev";

export interface MountEntry {
  /** Where it is mounted (unescaped). */
  point: string;
  /** The folder of its file system it shows (for a bind: the bound folder, relative to that file system). */
  root: string;
  /** Its per-mount options (`ro`, `nosuid`, ...). */
  options: string[];
  fsType: string;
  source: string;
}

/** `\040`-style escapes of mountinfo (space, tab, newline, backslash). */
const unescape = (s: string): string =>
  s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));

/** Parses `/proc/<pid>/mountinfo` (proc(5)); lines it cannot read are skipped. */
export function parseMountInfo(text: string): MountEntry[] {
  const out: MountEntry[] = [];
  for (const line of text.split("\n")) {
    const f = line.split(" ");
    const dash = f.indexOf("-", 6);
    if (f.length < 10 || dash < 0) continue;
    out.push({
      root: unescape(f[3]!),
      point: unescape(f[4]!),
      options: f[5]!.split(","),
      fsType: f[dash + 1] ?? "",
      source: unescape(f[dash + 2] ?? ""),
    });
  }
  return out;
}

/** The topmost mount at `path` (its real path when it exists), or undefined when none is there. */
export async function mountAt(
  path: string,
  mountinfo = "/proc/self/mountinfo",
): Promise<MountEntry | undefined> {
  const real = await realpath(path).catch(() => path);
  const entries = parseMountInfo(await readFile(mountinfo, "utf8"));
  return entries.filter((e) => e.point === real).at(-1);
}

/** Whether `a` and `b` are the same folder (same device and inode: a bind shows its source's root). */
export async function sameInode(a: string, b: string): Promise<boolean> {
  const [x, y] = await Promise.all([stat(a, { bigint: true }), stat(b, { bigint: true })]).catch(
    () => [undefined, undefined] as const,
  );
  return Boolean(x && y && x.dev === y.dev && x.ino === y.ino);
}

/**
 * Binds `source` at `target` and makes that bind read-only, nosuid and nodev. A failure of the
 * second step removes the bind: a writable bind is never left where read-only was meant.
 */
export async function bindReadOnly(source: string, target: string): Promise<void> {
  await run("mount", ["--bind", source, target]);
  await remountReadOnly(target).catch(async (err: unknown) => {
    await run("umount", [target]).catch(() => undefined);
    throw err;
  });
}

export async function remountReadOnly(target: string): Promise<void> {
  await run("mount", ["-o", READ_ONLY_BIND, target]);
}

/** Unmounts everything mounted at `target` (stacked mounts included); at most `max` layers. */
export async function unmountAll(target: string, max = 16): Promise<number> {
  let n = 0;
  while (n < max && (await mountAt(target))) {
    await run("umount", [target]);
    n++;
  }
  if (await mountAt(target)) throw new Error(`${target} is still a mount point after ${max} unmounts`);
  return n;
}
