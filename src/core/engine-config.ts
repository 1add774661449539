/**
 * vLLM's config line ("Initializing a V1 LLM engine (vX) with config: ..."), read for the
 * top-level settings that go into its compile-cache key (its model config's and parallel config's
 * hashes): another value of any makes another compiled graph.
 */
export const ENGINE_CONFIG_KEYS = [
  "dtype",
  "quantization",
  "kv_cache_dtype",
  "max_seq_len",
  "tensor_parallel_size",
  "pipeline_parallel_size",
  "enforce_eager",
  "device_config",
] as const;
export const CONFIG_LINE = "Initializing a V1 LLM engine (";
const CONFIG_VERSION = /Initializing a V1 LLM engine \(v?([\w.+-]{1,64})\) with config: /;
const CONFIG_VALUES = new Map(
  ENGINE_CONFIG_KEYS.map((k) => [k, new RegExp(`(?:: |, )${k}=([\\w.'/+-]{1,64})(?:,|$)`)]),
);

/** The compile-relevant settings of vLLM's config line (bounded: fixed keys, short values). */
export function vllmConfig(line: string): Record<string, string> {
  const out: Record<string, string> = {};
  const version = CONFIG_VERSION.exec(line)?.[1];
  if (version) out.version = version;
  for (const [key, re] of CONFIG_VALUES) {
    const v = re.exec(line)?.[1];
    if (v !== undefined) out[key] = v;
  }
  return out;
}
