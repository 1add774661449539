/**
 * A pod's credentials never reach a tree other pods start from: every tool's credential file, by
 * its path wherever it sits in the tree (a captured HOME, a HF home on the pod's emptyDir), and
 * any small file whose first bytes hold a key or a token; while an engine's cache files that
 * merely contain token-like strings (a tokenizer's vocabulary) are kept.
 */
import assert from "node:assert/strict";
import { link, mkdir, readFile, stat, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { capture } from "./capture.js";
import { isCredentialFile, looksLikeCredential, sniffable, SNIFF_MAX_SIZE } from "./credentials.js";
import type { Manifest } from "./manifest.js";
import { tempDir } from "../../test/support/datapath.js";

const HF = `hf_${"aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE2f"}`;
const GHP = `ghp_${"A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"}`;
const PEM =
  "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA0Z3VS5JJcds3xfn\n-----END RSA PRIVATE KEY-----\n";

/** Credential files by path: a HOME captured under cache/home, a HF home on the pod's emptyDir. */
const BY_PATH = [
  ...[
    ".netrc",
    "_netrc",
    ".git-credentials",
    ".config/git/credentials",
    ".huggingface/token",
    ".cache/huggingface/token",
    ".cache/huggingface/stored_tokens",
    ".docker/config.json",
    ".config/containers/auth.json",
    ".config/helm/registry/config.json",
    ".config/gcloud/credentials.db",
    ".config/gcloud/access_tokens.db",
    ".config/gcloud/application_default_credentials.json",
    ".config/gcloud/legacy_credentials/me@example.com/adc.json",
    ".boto",
    ".azure/accessTokens.json",
    ".azure/msal_token_cache.json",
    ".azure/msal_token_cache.bin",
    ".azure/service_principal_entries.json",
    ".aws/credentials",
    ".aws/config",
    ".aws/sso/cache/0a1b.json",
    ".aws/cli/cache/2c3d.json",
    ".s3cfg",
    ".kube/config",
    "clusters/kubeconfig",
    "clusters/admin.kubeconfig",
    ".ngc/config",
    ".npmrc",
    ".yarnrc.yml",
    ".pypirc",
    ".config/pip/pip.conf",
    ".cargo/credentials.toml",
    ".gem/credentials",
    ".m2/settings.xml",
    ".pgpass",
    ".my.cnf",
    ".ssh/id_rsa",
    ".ssh/id_ed25519",
    ".gnupg/private-keys-v1.d/AB12.key",
    ".config/gh/hosts.yml",
    ".vault-token",
    ".terraform.d/credentials.tfrc.json",
    ".config/kaggle/kaggle.json",
    ".kaggle/kaggle.json",
    ".modelscope/credentials/git_token",
    ".databrickscfg",
    ".ollama/id_ed25519",
    "app/.env",
  ].map((p) => `cache/home/${p}`),
  // HF_HOME=/model-cache on the pod's emptyDir (llm-d): the token beside the hub cache.
  "model/at/model-cache/token",
  "model/at/model-cache/stored_tokens",
  // The built-in template's HF_HOME, and a capture of a HF home itself.
  "model/huggingface/token",
  "token",
];

/** Small files under any name whose bytes are a credential. */
const BY_CONTENT: Record<string, string> = {
  "cache/x/key.txt": PEM,
  "cache/x/deploy": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n",
  "cache/x/pgp.asc": "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF\n",
  "cache/x/hf": `${HF}\n`,
  "cache/x/gh": GHP,
  "cache/x/settings.json": `{"endpoint": "https://api.example.com", "api_key": "sk-proj-${"Ab1".repeat(10)}"}`,
  "cache/x/conf.yaml": `endpoint: x\nngc:\n  token: nvapi-${"Xy9_".repeat(8)}\n`,
  "cache/x/slack.env": "SLACK_BOT_TOKEN=xoxb-1234-5678-abcdefABCDEF\n",
  "cache/x/login.sh": `#!/bin/sh\nexport HF_TOKEN="${HF}"\nexec vllm serve\n`,
  "cache/x/aws.ini": `[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n`,
  "cache/x/sa.json": JSON.stringify({
    type: "service_account",
    project_id: "p",
    private_key_id: "1",
    private_key: PEM,
  }),
  "cache/x/adc.json": JSON.stringify({ type: "authorized_user", client_id: "c", refresh_token: "1//0g" }),
  "cache/x/wandb":
    "machine api.wandb.ai\n  login user\n  password 0123456789abcdef0123456789abcdef01234567\n",
  "cache/x/registry.json": JSON.stringify({ auths: { "nvcr.io": { auth: "JG9hdXRodG9rZW46bnZhcGk=" } } }),
  "cache/x/admin.conf": `apiVersion: v1\nkind: Config\nusers:\n- name: a\n  user:\n    client-key-data: ${"LS0t".repeat(8)}\n`,
  "cache/x/sa-token": `eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.eyJpc3MiOiJrdWJlcm5ldGVzIiwic3ViIjoicyJ9.${"Qm9".repeat(12)}`,
  // Beyond the bytes read, the first ones still tell.
  "cache/x/long.pem": PEM + "x".repeat(20_000),
};

/** An engine's files with token-like strings inside: kept. */
const KEPT: Record<string, string> = {
  "model/hub/models--o--m/snapshots/r/tokenizer.json": JSON.stringify({
    version: "1.0",
    added_tokens: [{ id: 0, content: HF, special: true }],
    model: { type: "BPE", vocab: { [HF]: 1, [GHP]: 2, token: 3, api_key: 4, "sk-": 5 }, merges: ["h f_"] },
  }),
  "model/hub/models--o--m/snapshots/r/vocab.txt": ["[PAD]", "[UNK]", HF, GHP, "token", "the"].join("\n"),
  "model/hub/models--o--m/snapshots/r/tokenizer_config.json": JSON.stringify({
    pad_token: "<pad>",
    bos_token: "<s>",
    auth_token: null,
    chat_template: `{{ bos_token }}{% for m in messages %}${HF} {{ m.content }}{% endfor %}`,
  }),
  "model/hub/models--o--m/snapshots/r/config.json": '{"model_type": "llama", "vocab_size": 32000}',
  "cache/triton/abc/kernel.json": '{"name": "kernel", "hash": "abc", "shared": 0}',
  "cache/vllm/token": "3\n",
  "cache/home/.ssh/id_rsa.pub": "ssh-rsa AAAAB3NzaC1yc2E user@host\n",
  "cache/home/.azure/azureProfile.json": '{"subscriptions": []}',
  "cache/home/.kube/cache/discovery/v1.json": '{"kind": "APIResourceList"}',
};

async function put(root: string, files: Record<string, string>): Promise<void> {
  for (const [rel, body] of Object.entries(files)) {
    await mkdir(dirname(join(root, rel)), { recursive: true });
    await writeFile(join(root, rel), body);
  }
}

/** Captures `files` (with an empty hub cache in the HF home on the emptyDir); the tree's folder. */
async function captured(
  t: Parameters<typeof tempDir>[0],
  files: Record<string, string>,
): Promise<{ m: Manifest; tree: string }> {
  const dir = tempDir(t, "ws-cred-");
  await put(join(dir, "src"), files);
  await mkdir(join(dir, "src/model/at/model-cache/hub"), { recursive: true });
  const tree = join(dir, "tree");
  return { m: await capture({ src: join(dir, "src"), dest: tree, progress: false, durable: false }), tree };
}

void test("every tool's credential file, wherever it sits, stays out of the tree and is listed", async (t) => {
  const files = Object.fromEntries(BY_PATH.map((p) => [p, "not a secret by its bytes\n"]));
  const { m, tree } = await captured(t, { ...files, ...KEPT });
  for (const p of BY_PATH) {
    assert.ok(
      m.skipped.some((s) => s.path === p && s.reason === "credential"),
      `${p} listed as a credential`,
    );
    await assert.rejects(stat(join(tree, p)), /ENOENT/, `${p} not in the tree`);
  }
  for (const [p, body] of Object.entries(KEPT))
    assert.equal(await readFile(join(tree, p), "utf8"), body, `${p} kept as it was`);
});

void test("a small file whose first bytes are a key or a token stays out, whatever its name", async (t) => {
  const { m, tree } = await captured(t, { ...BY_CONTENT, ...KEPT });
  for (const p of Object.keys(BY_CONTENT)) {
    assert.ok(
      m.skipped.some((s) => s.path === p && s.reason === "credential"),
      `${p} listed as a credential`,
    );
    await assert.rejects(stat(join(tree, p)), /ENOENT/, `${p} not in the tree`);
  }
  for (const [p, body] of Object.entries(KEPT))
    assert.equal(await readFile(join(tree, p), "utf8"), body, `${p} kept as it was`);
});

void test("a credential's other names (hard links) go with it", async (t) => {
  const dir = tempDir(t, "ws-cred-");
  const src = join(dir, "src");
  await put(src, { "cache/home/.netrc": "x\n", "cache/home/.docker/config.json": "{}" });
  await mkdir(join(src, "cache/a"), { recursive: true });
  await link(join(src, "cache/home/.netrc"), join(src, "cache/a/notes"));
  await link(join(src, "cache/home/.docker/config.json"), join(src, "cache/a/z.json"));
  const m = await capture({ src, dest: join(dir, "tree"), progress: false, durable: false });
  for (const p of ["cache/a/notes", "cache/a/z.json"]) {
    assert.ok(
      m.skipped.some((s) => s.path === p && s.reason === "credential"),
      p,
    );
    await assert.rejects(stat(join(dir, "tree", p)), /ENOENT/, p);
  }
});

void test("the hub token rule: beside a hub cache, in a huggingface folder, or at the top", () => {
  assert.equal(isCredentialFile("model/at/model-cache/token", ["hub", "token", "xet"]), true);
  assert.equal(isCredentialFile("model/at/data/token", ["models"]), false, "no hub beside it");
  assert.equal(isCredentialFile("any/where/stored_tokens"), true, "stored_tokens is the hub client's alone");
  assert.equal(isCredentialFile("cache/home/.cache/huggingface/token"), true);
  assert.equal(isCredentialFile("token"), true);
  assert.equal(isCredentialFile("cache/home/.ssh/known_hosts"), true, "all of .ssh but public keys");
  assert.equal(isCredentialFile("cache/home/.ssh/id_rsa.pub"), false);
  assert.equal(isCredentialFile("cache/home/.aws/sso/cache"), false, "a file named cache, not below it");
});

void test("only small files are read, and only a token on its own or under a secret's key counts", () => {
  assert.equal(sniffable("cache/x/a.json", 10n), true);
  assert.equal(sniffable("cache/x/a.json", 0n), false);
  assert.equal(sniffable("model/w.bin", BigInt(SNIFF_MAX_SIZE) + 1n), false, "weights are never read twice");
  assert.equal(sniffable("cache/triton/k.cubin", 100n), false);
  const b = (s: string): Buffer => Buffer.from(s, "latin1");
  assert.equal(looksLikeCredential(b(HF), true), true);
  assert.equal(looksLikeCredential(b(HF), false), false, "a prefix that is one token may go on");
  assert.equal(looksLikeCredential(b(`${HF}\n${GHP}\n`), true), false, "a list of strings");
  assert.equal(looksLikeCredential(b(`{"token": "${HF}"}`), true), true);
  assert.equal(looksLikeCredential(b(`{"pad_token": "<pad>", "x": "${HF}"}`), true), false);
  assert.equal(looksLikeCredential(b(`{"${HF}": 7}`), true), false, "a token as a key");
  assert.equal(looksLikeCredential(b("password = hunter2"), true), false, "not a known token format");
  // A long run without a separator is one try, not one per byte.
  const t0 = performance.now();
  looksLikeCredential(Buffer.alloc(4096, "a"), true);
  assert.ok(performance.now() - t0 < 50, "linear in the bytes read");
});
