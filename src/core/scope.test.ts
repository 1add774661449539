import { test } from "node:test";
import assert from "node:assert/strict";
import { CLUSTER_SCOPE_KEY, namespaceInScope, scopeKey } from "./scope.js";
import { LABEL_SHARE_GROUP, UNADMITTED_NAMESPACES } from "./contract.js";
import { webhookConfiguration } from "../webhook/registration.js";

void test("no scope holds a namespace the webhook is never sent: a stamp there is its author's own", () => {
  const group = { [LABEL_SHARE_GROUP]: "team" };
  for (const ns of UNADMITTED_NAMESPACES) {
    assert.equal(namespaceInScope(CLUSTER_SCOPE_KEY, ns, undefined), false, `${ns} in the cluster scope`);
    assert.equal(namespaceInScope(`namespace:${ns}`, ns, undefined), false, `${ns} in its own scope`);
    assert.equal(namespaceInScope("group:team", ns, group), false, `${ns} labelled into a group`);
  }
  assert.equal(namespaceInScope(CLUSTER_SCOPE_KEY, "default", undefined), true);
  assert.equal(namespaceInScope(scopeKey("group", "a", group), "b", group), true);
  // The namespaces left out are the ones the registration leaves out.
  const config = webhookConfiguration({ name: "w", url: "https://x", caBundle: "ca", timeoutSeconds: 5 });
  const selector = config.webhooks?.[0]?.namespaceSelector?.matchExpressions?.[0];
  assert.deepEqual(selector?.values, [...UNADMITTED_NAMESPACES]);
  assert.equal(selector?.operator, "NotIn");
});
