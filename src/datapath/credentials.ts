/**
 * Credential files a pod may leave in its cache folders: never copied into a tree that other
 * pods, maybe of other teams, start from. A captured folder may be a whole HOME (the cache-env
 * template points HOME into the cache root), so the tools' own locations are matched wherever
 * they sit in the tree. A file is set aside by its path (CREDENTIAL_PATHS, the hub token below)
 * or, when it is small, by what its first bytes hold (looksLikeCredential).
 *
 * Paths and contents are byte strings (beneath.ts): one character per byte.
 */

/**
 * Path patterns, matched against the end of a file's path in the tree, one name per component:
 * `*` is any run of characters within a name, a trailing `**` anything below. `except` keeps the
 * names it matches.
 */
export const CREDENTIAL_PATHS: ReadonlyArray<{ tool: string; paths: readonly string[]; except?: RegExp }> = [
  { tool: "netrc (curl, git, pip, wandb, the hub client before 0.14)", paths: [".netrc", "_netrc"] },
  { tool: "git credential store", paths: [".git-credentials", "git/credentials"] },
  { tool: "Hugging Face hub client, old location", paths: [".huggingface/token"] },
  { tool: "Docker", paths: [".docker/config.json", ".dockercfg"] },
  { tool: "Podman, Skopeo, Buildah", paths: ["containers/auth.json"] },
  { tool: "Helm registries", paths: ["helm/registry/config.json"] },
  {
    tool: "gcloud (CLOUDSDK_CONFIG, default ~/.config/gcloud)",
    paths: [
      "gcloud/credentials.db",
      "gcloud/access_tokens.db",
      "gcloud/application_default_credentials.json",
      "gcloud/legacy_credentials/**",
    ],
  },
  { tool: "gsutil, boto", paths: [".boto"] },
  {
    // azureProfile.json and config hold no secret.
    tool: "Azure CLI (AZURE_CONFIG_DIR, default ~/.azure)",
    paths: [
      ".azure/accessTokens.json",
      ".azure/msal_token_cache.*",
      ".azure/msal_http_cache.*",
      ".azure/service_principal_entries.*",
    ],
  },
  {
    // The CLI's config may hold keys too (aws configure set writes them there).
    tool: "AWS CLI and SDKs",
    paths: [".aws/credentials", ".aws/config", ".aws/sso/cache/**", ".aws/cli/cache/**", ".aws/login/**"],
  },
  { tool: "s3cmd", paths: [".s3cfg"] },
  { tool: "kubectl", paths: [".kube/config", "kubeconfig", "*.kubeconfig"] },
  { tool: "NVIDIA NGC CLI", paths: [".ngc/config"] },
  { tool: "npm, Yarn", paths: [".npmrc", ".yarnrc.yml"] },
  { tool: "PyPI uploads (twine)", paths: [".pypirc"] },
  { tool: "pip (index URLs with a user and password)", paths: ["pip/pip.conf", ".pip/pip.conf"] },
  { tool: "Cargo, RubyGems", paths: [".cargo/credentials", ".cargo/credentials.toml", ".gem/credentials"] },
  { tool: "Maven", paths: [".m2/settings.xml", ".m2/settings-security.xml"] },
  { tool: "PostgreSQL, MySQL clients", paths: [".pgpass", ".my.cnf"] },
  { tool: "OpenSSH: private keys (public ones stay)", paths: [".ssh/**"], except: /\.pub$/ },
  { tool: "GnuPG", paths: [".gnupg/**"] },
  { tool: "GitHub CLI", paths: ["gh/hosts.yml"] },
  { tool: "HashiCorp Vault, Terraform", paths: [".vault-token", ".terraform.d/credentials.tfrc.json"] },
  { tool: "Kaggle", paths: ["kaggle/kaggle.json", ".kaggle/kaggle.json"] },
  { tool: "ModelScope login", paths: [".modelscope/credentials/**"] },
  { tool: "Databricks CLI", paths: [".databrickscfg"] },
  { tool: "Ollama's private key", paths: [".ollama/id_ed25519"] },
  { tool: "dotenv files", paths: [".env"] },
];

const escape = (s: string): string => s.replace(/[.+?^${}()|[\]\\]/g, "\\$&");
const component = (c: string): string => c.split("*").map(escape).join("[^/]*");

const RULES = CREDENTIAL_PATHS.flatMap((r) =>
  r.paths.map((p) => {
    const parts = p.split("/");
    const below = parts.at(-1) === "**";
    if (below) parts.pop();
    const re = new RegExp(`(?:^|/)${parts.map(component).join("/")}${below ? "/.+" : ""}$`);
    return { re, except: r.except };
  }),
);

/**
 * The Hugging Face hub client's login (`huggingface-cli login`, `HF_TOKEN` saved by
 * `login()`): `<HF_HOME>/token` and `<HF_HOME>/stored_tokens`. HF_HOME is any folder a chart
 * picks (llm-d: `/model-cache`), captured whole when it is the pod's emptyDir, so a HF home is
 * told by its layout: the folder named huggingface, the folder that holds the hub cache (`hub`),
 * or the top of the tree (a capture of HF_HOME itself).
 */
const HUB_TOKENS = new Set(["token", "stored_tokens"]);

/**
 * Whether the regular file at `rel` (a path in the tree) is a credential file by its path.
 * `siblings`: the names in its folder, when known (a HF home is told by its `hub`).
 */
export function isCredentialFile(rel: string, siblings?: readonly string[]): boolean {
  const parts = rel.split("/");
  const name = parts.at(-1) ?? "";
  if (HUB_TOKENS.has(name)) {
    const parent = parts.at(-2);
    if (parent === undefined || parent === "huggingface" || parent === ".huggingface") return true;
    if (name === "stored_tokens" || siblings?.includes("hub")) return true;
  }
  return RULES.some((r) => r.re.test(rel) && !r.except?.test(name));
}

/** Files at most this big are read to see whether they hold a credential; the bigger ones are
 * model weights and compiled kernels, never read twice. */
export const SNIFF_MAX_SIZE = 64 * 1024;
/** How much of a file is read for it. */
export const SNIFF_BYTES = 4096;

// Engine artefacts that hold no text someone would put a secret in: not read.
const NOT_SNIFFED =
  /\.(?:so|o|a|cubin|fatbin|hsaco|ptx|ttir|ttgir|llir|amdgcn|spv|safetensors|gguf|pt|pth|ckpt|onnx|plan|engine|npy|npz|arrow|parquet|pyc)$/;

/** Whether the file at `rel` of `size` bytes is read for looksLikeCredential. */
export const sniffable = (rel: string, size: bigint): boolean =>
  size > 0n && size <= BigInt(SNIFF_MAX_SIZE) && !NOT_SNIFFED.test(rel);

/**
 * Token formats of the services a model server talks to, whole: Hugging Face, GitHub, GitLab,
 * Slack, NGC, OpenAI (and sk- keys alike), Google API keys, Stripe, npm, PyPI, Vault, Databricks,
 * Replicate, Groq, and JWTs (Kubernetes service account and OIDC tokens).
 */
const TOKEN = new RegExp(
  `^(?:${[
    "hf_[A-Za-z0-9]{30,}",
    "gh[pousr]_[A-Za-z0-9]{30,}",
    "github_pat_[A-Za-z0-9_]{40,}",
    "glpat-[A-Za-z0-9_-]{20,}",
    "xox[abposr]-[A-Za-z0-9-]{10,}",
    "nvapi-[A-Za-z0-9_-]{20,}",
    "sk-[A-Za-z0-9_-]{20,}",
    "AIza[A-Za-z0-9_-]{35}",
    "[sr]k_live_[A-Za-z0-9]{20,}",
    "npm_[A-Za-z0-9]{36}",
    "pypi-[A-Za-z0-9_-]{50,}",
    "hv[sbr]\\.[A-Za-z0-9_-]{20,}",
    "dapi[0-9a-f]{32}",
    "r8_[A-Za-z0-9]{30,}",
    "gsk_[A-Za-z0-9]{40,}",
    "eyJ[A-Za-z0-9_-]{10,}\\.eyJ[A-Za-z0-9_-]{10,}\\.[A-Za-z0-9_-]{10,}",
  ].join("|")})$`,
);
/** Keys whose value is a secret: `token`, `api_key`, `password`, `client_secret`... */
const SECRET_KEY = /token|secret|passw|pwd|api[_-]?key|access[_-]?key|private[_-]?key|auth|credential/i;
/** `key: value`, `key = value`, `"key": "value"`, `export KEY=value`, one at a time. A key
 * starts where a run of key characters does, so a long run costs one try, not one per byte. */
const KEY_VALUE = /(?<![A-Za-z0-9_.-])["']?([A-Za-z0-9_.-]+)["']?[ \t]*[:=][ \t]*["']?([^\s"',;}]+)/g;
/** A PEM private key: at the start of a line, or of a quoted value (a JSON key file). */
const PEM_KEY = /(?:^[ \t]*|["'])-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----/m;

/** A netrc entry with its password, on one line or several (wandb writes it so). */
const NETRC = /(?:^|\s)machine\s+\S+(?:\s+(?:login|account|port)\s+\S+)*\s+password\s+\S/;

/** Whole documents of a credential kind, told apart by two markers each. */
const DOCUMENTS: ReadonlyArray<readonly [RegExp, RegExp]> = [
  // AWS: an access key id with its secret.
  [/\b(?:AKIA|ASIA)[0-9A-Z]{16}\b/, /secret_?access_?key["']?\s*[:=]\s*["']?[A-Za-z0-9/+]{40}/i],
  // Google: a service account key, or a user's refresh token (application default credentials).
  [
    /"type"\s*:\s*"(?:service_account|authorized_user|impersonated_service_account)"/,
    /"(?:private_key|refresh_token|client_secret)"\s*:/,
  ],
  // Docker, Podman: registry logins.
  [/"auths"\s*:/, /"(?:auth|identitytoken)"\s*:\s*"[A-Za-z0-9+/=_.-]{8,}"/],
  // A kubeconfig with a client key.
  [/^\s*kind:\s*Config\s*$/m, /^\s*(?:client-key-data|token):\s*\S{16,}/m],
];

/**
 * Whether a file's first bytes (`prefix`; `whole` when that is all of it) hold a credential: a
 * PEM private key, a netrc entry with a password, a known document (above), the whole file one
 * token, or a token as the value of a secret-named key. A token inside other text (a tokenizer's
 * vocabulary, a chat template) does not count: tokenizers hold arbitrary strings.
 */
export function looksLikeCredential(prefix: Buffer, whole: boolean): boolean {
  const text = prefix.toString("latin1");
  if (PEM_KEY.test(text)) return true;
  if (NETRC.test(text)) return true;
  if (DOCUMENTS.some(([a, b]) => a.test(text) && b.test(text))) return true;
  if (whole && TOKEN.test(text.trim())) return true;
  for (const [, key, value] of text.matchAll(KEY_VALUE))
    if (SECRET_KEY.test(key as string) && TOKEN.test(value as string)) return true;
  return false;
}
