// @ts-check
import tseslint from "typescript-eslint";

/**
 * The layout's rules (docs/ARCHITECTURE.md). A role is a folder of src/ that runs as its own
 * `warmstart <role>` process; the shared folders hold what several roles use. A role imports
 * shared code, never another role (`cli` loads each role's `cli.js` registrar, nothing else);
 * shared code never imports a role; `core` is pure. Tests (`*.test.ts`) may stand up the other
 * side of a contract (an in-process control plane for the cluster agent's tests), so the role
 * rule holds for production files only.
 */
const ROLES = ["webhook", "server", "node-agent", "cluster-agent", "control-plane", "cli"];
const SHARED = ["core", "common", "datapath", "promote", "api"];

/**
 * Imports between roles that stay for now, each with its reason. Keyed by the importing role;
 * `modules` are the other role's files (without .js) it may import.
 */
const ROLE_EXCEPTIONS = {
  "cluster-agent": [
    {
      // The control plane's wire schemas (api.ts) and its typed client (client.ts) are the
      // contract both sides speak. They belong in the shared api/ package, and move there in a
      // change of their own (most control-plane and cluster-agent modules import them).
      role: "control-plane",
      modules: ["api", "client"],
    },
  ],
};

/**
 * Production files allowed over the size limit while they are being split (none now). An entry
 * names the file and, in a comment, the split under way; it comes off when the split lands.
 */
const MAX_LINES_EXCEPTIONS = [];

/**
 * The ModelCache's phases and status reasons are values of src/api/ (`PHASE`, `REASON`): production
 * code elsewhere names them through those, so a literal of one is a phase or reason written or read
 * behind the API's back. Kept equal to the API's values by src/api/reasons.test.ts.
 */
export const CACHE_WORDS = [
  ...["Electing", "Capturing", "Promoting", "Ready", "Failed"],
  ...["LeaderElected", "CaptureStarted", "Captured", "Promoted", "CaptureFailed", "PromoteFailed"],
  ...["Unsupported", "LeaderGone", "DeadlinePassed", "CaptureEnded", "CacheTooLarge", "LeaderEvicted"],
  "Deleting",
];
const CACHE_WORD_SELECTOR = {
  // A Kubernetes condition's type (`c.type === "Ready"`, `condition("Ready")`) is not the cache's phase.
  selector: `:not(BinaryExpression[left.property.name='type'], BinaryExpression[right.property.name='type'], CallExpression[callee.name='condition']) > Literal[value=/^(?:${CACHE_WORDS.join("|")})$/]`,
  message: "a ModelCache phase or status reason is a value of src/api/ (PHASE, REASON), not a string literal",
};

/**
 * Production files that still hold phase or reason literals, each with its reason. An entry
 * comes off when its file names them through src/api/.
 */
const CACHE_WORD_EXCEPTIONS = [
  // Their own vocabularies: the control plane's workload and request phases, a Pod's phase.
  "src/cluster-agent/**/*.ts",
  "src/control-plane/**/*.ts",
  "src/promote/tree-volume.ts",
];

const relative = "^(?:\\./)?(?:\\.\\./)+";
const TOOLS_PATTERN = {
  regex: "(^|/)(tools|localcluster|demo)/",
  message:
    "the product never imports the development tools (tools/); read the local cluster's state through src/common/local-defaults.ts",
};

/** The import patterns one folder of src/ may not use in its production files. */
function folderPatterns(folder) {
  const patterns = [
    TOOLS_PATTERN,
    {
      regex: `${relative}(test|bench|scripts)/`,
      message: "production code never imports tests, their support or benchmarks",
    },
  ];
  if (ROLES.includes(folder)) {
    const allowed = (ROLE_EXCEPTIONS[folder] ?? []).map((e) => `${e.role}/(?:${e.modules.join("|")})\\.js$`);
    if (folder === "cli") allowed.push("[^/]+/cli\\.js$");
    const others = ROLES.filter((r) => r !== folder).join("|");
    const notAllowed = allowed.length ? `(?!${allowed.join("|")})` : "";
    patterns.push({
      regex: `${relative}${notAllowed}(?:${others})/`,
      message: `a role does not import another role's modules: move what both need to core/ (pure), common/, datapath/, promote/ or api/${folder === "cli" ? " (cli loads each role's cli.js registrar only)" : ""}`,
    });
  } else {
    patterns.push({
      regex: `${relative}(?:${ROLES.join("|")})/`,
      message: "shared code never imports a role",
    });
  }
  if (folder === "core")
    patterns.push(
      {
        regex: `${relative}(?!(?:core|api)/)[^./][^/]*/`,
        message: "core is pure: it imports core/ and api/ only",
      },
      {
        regex:
          "^(node:)?(fs|fs/promises|child_process|net|http|https|http2|dgram|worker_threads|cluster)$|^pino$",
        message: "core is pure: no file system, processes, network or logger (those belong to its callers)",
      },
    );
  return patterns;
}

/** Dynamic `import("...")` with a literal source is held to the same patterns. */
function importExpressionSelectors(patterns) {
  return patterns.map((p) => ({
    selector: `ImportExpression[source.value=/${p.regex.replaceAll("/", "\\x2F")}/]`,
    message: p.message,
  }));
}

export default tseslint.config(
  { ignores: ["dist/", "node_modules/", "deploy/", "**/*.js", "**/*.mjs"] },
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      // node:test's test()/describe() return promises the runner itself awaits.
      "@typescript-eslint/no-floating-promises": [
        "error",
        {
          allowForKnownSafeCalls: [
            {
              from: "package",
              package: "node:test",
              name: ["test", "describe", "it", "suite", "before", "after"],
            },
          ],
        },
      ],
      "@typescript-eslint/no-misused-promises": ["error", { checksVoidReturn: { arguments: false } }],
      "@typescript-eslint/explicit-module-boundary-types": "error",
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
      "@typescript-eslint/restrict-template-expressions": [
        "error",
        { allowNumber: true, allowBoolean: true },
      ],
    },
  },
  {
    // Production files stay small enough to read in one sitting: every line counts.
    files: ["src/**/*.ts"],
    ignores: ["**/*.test.ts", ...MAX_LINES_EXCEPTIONS],
    rules: { "max-lines": ["error", { max: 500, skipBlankLines: false, skipComments: false }] },
  },
  // Imports between folders of the product, one block per folder (production files).
  ...[...ROLES, ...SHARED].map((folder) => {
    const patterns = folderPatterns(folder);
    const words = folder === "api" ? [] : [CACHE_WORD_SELECTOR];
    return {
      files: [`src/${folder}/**/*.ts`],
      ignores: ["**/*.test.ts"],
      rules: {
        "no-restricted-imports": ["error", { patterns }],
        "no-restricted-syntax": ["error", ...importExpressionSelectors(patterns), ...words],
      },
    };
  }),
  // The files left with phase or reason literals keep their folder's import rules only.
  ...CACHE_WORD_EXCEPTIONS.map((file) => ({
    files: [file],
    ignores: ["**/*.test.ts"],
    rules: {
      "no-restricted-syntax": ["error", ...importExpressionSelectors(folderPatterns(file.split("/")[1]))],
    },
  })),
  {
    // The product's tests run from a checkout, but still without the development tools.
    files: ["src/**/*.test.ts"],
    rules: {
      "no-restricted-imports": ["error", { patterns: [TOOLS_PATTERN] }],
      "no-restricted-syntax": ["error", ...importExpressionSelectors([TOOLS_PATTERN])],
    },
  },
);
