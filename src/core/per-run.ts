/**
 * Per-run detection for `warmstart explain`: hash inputs that look like they change from run to
 * run, or pod to pod (random ids, timestamps, a pod's index or identity, floating image tags), and
 * so would make every pod miss the cache.
 */
import type { HashInputs } from "./hash.js";
import { looksLikeShell, shellWords } from "./shell.js";

/** An input that looks like it changes from run to run, or pod to pod. */
export interface PerRunFlag {
  input: string;
  value: string;
  why: string;
}

const UUID = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/i;
const TIMESTAMP =
  /\d{4}-[01]\d-[0-3]\d[T _][0-2]\d:?[0-5]\d|(^|\D)20\d{2}[01]\d[0-3]\d[T_-]?[0-2]\d[0-5]\d([0-5]\d)?(\D|$)/;
const EPOCH = /(^|\D)1[5-9]\d{8}(\d{3})?(\D|$)/;
const HEX_ID = /(^|[^0-9a-z])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{12,}([^0-9a-z]|$)/i;
// A pod's place in its workload: `POD_INDEX`, `JOB_COMPLETION_INDEX`, `WORKER_INDEX`, `RANK`,
// `NODE_RANK`, `REPLICA_ID`. A settings name that merely ends in INDEX (`NCCL_IB_GID_INDEX`,
// a device or port index) is configuration, the same in every pod.
const INDEX_ENV =
  /^(?:(?:[A-Z0-9]+_)*(?:POD|REPLICA|WORKER|GROUP|COMPLETION|MEMBER|INSTANCE|NODE|SHARD)_(?:INDEX|ORDINAL|ID)|(?:[A-Z0-9]+_)*(?:NODE_|LOCAL_|GLOBAL_|WORLD_)?RANK|ORDINAL|REPLICA_ID|INDEX)$/;
const IDENTITY_ENV = new Set(["POD_NAME", "HOSTNAME", "POD_IP", "POD_UID", "NODE_NAME"]);
const FLOATING_TAGS = new Set([
  "latest",
  "main",
  "master",
  "nightly",
  "dev",
  "develop",
  "edge",
  "head",
  "stable",
  "canary",
  "rolling",
  "unstable",
]);
// Pinned revisions are hex on purpose: not a random id.
const PINNING_FLAGS = new Set(["--revision", "--code-revision", "--tokenizer-revision"]);

/** Why a value looks like it changes per run; undefined when it does not. */
export function perRunValue(value: string): string | undefined {
  if (UUID.test(value)) return "looks like a random id (UUID)";
  if (TIMESTAMP.test(value)) return "looks like a timestamp";
  if (EPOCH.test(value)) return "looks like a Unix timestamp";
  if (HEX_ID.test(value)) return "looks like a random hex id (fine if it pins a version)";
  return undefined;
}

/** Why an image reference floats; undefined when it is pinned by a fixed tag or a digest. */
export function floatingImage(image: string): string | undefined {
  if (!image || image.includes("@")) return undefined;
  const last = image.slice(image.lastIndexOf("/") + 1);
  const colon = last.lastIndexOf(":");
  if (colon === -1) return "no tag, so latest: the hash stays the same while the image behind it changes";
  const tag = last.slice(colon + 1);
  if (FLOATING_TAGS.has(tag.toLowerCase())) {
    return `floating tag "${tag}": the hash stays the same while the image behind it changes`;
  }
  return undefined;
}

/** The hash inputs that look like they change every run or every pod. */
export function perRunInputs(i: HashInputs): PerRunFlag[] {
  const out: PerRunFlag[] = [];
  const img = floatingImage(i.image);
  if (img) out.push({ input: "image", value: i.image, why: img });
  if (i.model !== null) {
    const why = perRunValue(i.model);
    if (why) out.push({ input: "model", value: i.model, why });
  }
  const scanList = (name: "argv", list: readonly string[]): void => {
    list.forEach((item, k) => {
      const words = looksLikeShell(item) ? shellWords(item) : [item];
      words.forEach((w, j) => {
        const prev = j > 0 ? words[j - 1] : k > 0 ? list[k - 1] : undefined;
        const eq = w.indexOf("=");
        const flag = w.startsWith("-") && eq !== -1 ? w.slice(0, eq) : undefined;
        if ((prev && PINNING_FLAGS.has(prev)) || (flag && PINNING_FLAGS.has(flag))) return;
        const why = perRunValue(flag ? w.slice(eq + 1) : w);
        if (why) out.push({ input: `${name}[${k}]`, value: w, why });
      });
    });
  };
  scanList("argv", i.argv);
  for (const e of i.env) {
    if (e.value === undefined) continue; // references and credentials are the same in every pod
    if (INDEX_ENV.test(e.name))
      out.push({ input: `env.${e.name}`, value: e.value, why: "looks like a pod index" });
    else if (IDENTITY_ENV.has(e.name)) {
      out.push({ input: `env.${e.name}`, value: e.value, why: "looks like a per-pod identity" });
    } else if (!e.name.endsWith("REVISION")) {
      const why = perRunValue(e.value);
      if (why) out.push({ input: `env.${e.name}`, value: e.value, why });
    }
  }
  return out;
}
