/** What image layers are built from and keyed by: the Debian mirror, and digests of input files. */
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { readFile, readdir } from "node:fs/promises";
import { join, relative } from "node:path";
import { PACKAGE_ROOT } from "../versions.js";

/** The Debian mirror the machine's apt uses (debootstrap reaches nothing else). */
export async function debianMirror(): Promise<string> {
  const files = ["/etc/apt/sources.list"];
  try {
    for (const f of await readdir("/etc/apt/sources.list.d")) files.push(join("/etc/apt/sources.list.d", f));
  } catch {
    /* none */
  }
  for (const f of files) {
    const text = await readFile(f, "utf8").catch(() => "");
    const m =
      /^URIs:\s*(\S+\/debian)\/?\s*$/m.exec(text) ??
      /^deb\s+(?:\[[^\]]*\]\s+)?(\S+\/debian)\/?\s+\S+/m.exec(text);
    if (m) return m[1]!;
  }
  return "http://deb.debian.org/debian";
}

export async function sha256File(path: string): Promise<string> {
  const h = createHash("sha256");
  for await (const chunk of createReadStream(path)) h.update(chunk as Buffer);
  return h.digest("hex");
}

export async function fileKey(path: string): Promise<string> {
  return (await sha256File(path)).slice(0, 16);
}

/** A key over the names and bytes of a list of files. */
export async function filesKey(files: string[]): Promise<string> {
  const h = createHash("sha256");
  for (const f of files) {
    h.update(relative(PACKAGE_ROOT, f)).update("\0");
    h.update(await readFile(f)).update("\0");
  }
  return h.digest("hex").slice(0, 16);
}
