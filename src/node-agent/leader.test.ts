import assert from "node:assert/strict";
import { test } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import { ANN_HASH, ANN_LEADER_NAMESPACE, leaseName } from "../core/contract.js";
import { checkLeader } from "./leader.js";
import type { AgentParts } from "./parts.js";

const HASH = "0123456789abcdef".repeat(4);
const SHORT = HASH.slice(0, 16);

void test("a node agent that writes a gone election's record again stores the model without its credentials", async () => {
  const ensured: Array<Record<string, unknown>> = [];
  const parts = {
    cfg: { node: "gpu-0", systemNamespace: "warmstart-system" },
    record: () => undefined,
    coordination: {
      readNamespacedLease: ({ name }: { name: string }) => {
        assert.equal(name, leaseName(SHORT));
        return Promise.resolve({
          spec: { holderIdentity: "e1" },
          metadata: { annotations: { [ANN_HASH]: HASH, [ANN_LEADER_NAMESPACE]: "ns" } },
        });
      },
    },
    records: {
      get: () => Promise.resolve(undefined),
      ensure: (_: string, spec: Record<string, unknown>) => (ensured.push(spec), Promise.resolve()),
      claimLeader: () => Promise.resolve({ ok: true }),
    },
  } as unknown as AgentParts;
  const pod: k8s.V1Pod = {
    metadata: { name: "engine-0", namespace: "ns", uid: "u1" },
    spec: {
      containers: [
        {
          name: "engine",
          image: "vllm/vllm-openai:v0.9.0",
          // A user name holding an `@`, and a token in the query: both are the author's secrets.
          args: ["--model", "https://me@corp:tok3n@models.example.com/org/m?token=s3cret"],
          resources: { limits: { "nvidia.com/gpu": "1" } },
        },
      ],
    },
  };
  const claim = await checkLeader(parts, pod, HASH, "e1");
  assert.ok(claim.ok);
  assert.equal(ensured.length, 1, "the record is written again");
  const model = String(ensured[0]!.model);
  assert.doesNotMatch(model, /tok3n|s3cret|corp/, model);
  assert.match(model, /models\.example\.com\/org\/m/);
});
