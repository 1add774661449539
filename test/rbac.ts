/**
 * The Kubernetes API calls each role's code can make, derived from the source. From a role's
 * command action, every function, method and class it reaches is followed (TypeScript's checker
 * resolves each name; a class that is reached has all its members reached). Each call into
 * @kubernetes/client-node's generated API classes becomes the request it sends: path and HTTP
 * method come from the library's own generated request factories, a custom resource's group and
 * plural from the constants the call passes, and a list whose function feeds an informer is a
 * watch too. Where a namespaced call lands is traced back from its `namespace` through locals,
 * parameters (to every reached caller), fields and object literals, to what it is made of:
 *
 * - the role's configured namespace (`systemNamespace`, a role config's `namespace`): the system
 *   namespace;
 * - the cluster agent's allowlist (`namespaces`, a request's or record's namespace, which is
 *   refused unless allowlisted): the workload namespaces;
 * - an object's own `metadata.namespace`: where the role reads objects of that kind (the system
 *   namespace only when every get, list and watch of it is there);
 * - anything else: any namespace.
 *
 * Object names are traced the same way (constants, a configured name, or any). The over-
 * approximation is the function: a call is counted when its function is reachable, whatever
 * branch guards it. test/integration/rbac.test.ts compares the result with the chart's RBAC.
 */
import { readFileSync, readdirSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, relative } from "node:path";
import ts from "typescript";

/** Where a namespaced call lands: the system namespace, the configured workload namespaces, or any namespace. */
export type Scope = "cluster" | "system" | "workloads" | "any";
/** While deriving: the namespace of an object of this resource, as read by the role. */
type RawScope = Scope | `from:${string}`;

export interface ApiCall {
  group: string;
  /** `resource` or `resource/subresource`. */
  resource: string;
  verb: string;
  scope: Scope;
  /** Named calls: the object names (constants), "configured" (from the role's configuration), or undefined (any). */
  names?: string[] | "configured";
  /** Where in the source (file:line). */
  sites: string[];
}

export interface RoleEntry {
  role: string;
  /** The source file that registers the command, relative to the package root. */
  file: string;
  command: string;
}

interface Operation {
  method: string;
  path: string;
}

export class ApiCallDeriver {
  private readonly program: ts.Program;
  private readonly checker: ts.TypeChecker;
  private readonly operations: Map<string, Map<string, Operation>>;

  constructor(private readonly root: string) {
    const configPath = join(root, "tsconfig.json");
    const parsed = ts.parseJsonConfigFileContent(
      ts.readConfigFile(configPath, (p) => ts.sys.readFile(p)).config,
      ts.sys,
      root,
    );
    const files = parsed.fileNames.filter((f) => f.startsWith(join(root, "src")) && !f.endsWith(".test.ts"));
    this.program = ts.createProgram(files, { ...parsed.options, noEmit: true });
    this.checker = this.program.getTypeChecker();
    this.operations = readOperations(root);
  }

  /** Every API call reachable from one command's action. */
  derive(entry: RoleEntry): ApiCall[] {
    const file = this.program.getSourceFile(join(this.root, entry.file));
    if (!file) throw new Error(`${entry.file} is not part of the program`);
    const roots = this.actions(file, entry.command);
    if (roots.length === 0) throw new Error(`no .action() for command "${entry.command}" in ${entry.file}`);
    const seen = new Set<ts.Node>();
    const apiCalls: { call: ts.CallExpression; informer: boolean }[] = [];
    this.callSites = new Map();
    const queue: { node: ts.Node; informer: boolean }[] = roots.map((node) => ({ node, informer: false }));
    while (queue.length) {
      const { node, informer } = queue.pop()!;
      if (seen.has(node)) continue;
      seen.add(node);
      const visit = (n: ts.Node, inInformer: boolean): void => {
        if (ts.isCallExpression(n) || ts.isNewExpression(n)) {
          for (const callee of this.callees(n)) {
            const sites = this.callSites.get(callee) ?? [];
            sites.push(n);
            this.callSites.set(callee, sites);
          }
          if (ts.isCallExpression(n) && this.operation(n)) apiCalls.push({ call: n, informer: inInformer });
          if (this.isInformer(n)) {
            visit(n.expression, inInformer);
            for (const a of n.arguments ?? []) visit(a, true);
            return;
          }
        }
        if (ts.isIdentifier(n) || ts.isPrivateIdentifier(n)) {
          for (const d of this.declarations(n)) queue.push({ node: d, informer: inInformer });
        }
        ts.forEachChild(n, (c) => visit(c, inInformer));
      };
      visit(node, informer);
    }
    return dedupe(
      settleObjectNamespaces(apiCalls.flatMap(({ call, informer }) => this.apiCall(call, informer))),
    );
  }

  /** Call and `new` expressions of the reached code, by the function they call. */
  private callSites = new Map<ts.Node, (ts.CallExpression | ts.NewExpression)[]>();

  /** The function-like declarations (in our source) a call or `new` runs. */
  private callees(n: ts.CallExpression | ts.NewExpression): ts.Node[] {
    const target = ts.isPropertyAccessExpression(n.expression) ? n.expression.name : n.expression;
    let sym = this.checker.getSymbolAtLocation(target);
    if (sym && sym.flags & ts.SymbolFlags.Alias) sym = this.checker.getAliasedSymbol(sym);
    const out: ts.Node[] = [];
    for (const d of sym?.declarations ?? []) {
      if (ts.isClassDeclaration(d) || ts.isClassExpression(d)) {
        const ctor = d.members.find(ts.isConstructorDeclaration);
        if (ctor) out.push(ctor);
      } else if (ts.isVariableDeclaration(d) || ts.isPropertyDeclaration(d) || ts.isPropertyAssignment(d)) {
        const init = d.initializer && skipOuter(d.initializer);
        if (init && (ts.isArrowFunction(init) || ts.isFunctionExpression(init))) out.push(init);
      } else if (ts.isFunctionLike(d)) {
        out.push(d);
      }
    }
    return out;
  }

  /** The functions given to `.action()` on the chain that starts with `.command(name)`. */
  private actions(file: ts.SourceFile, command: string): ts.Node[] {
    const out: ts.Node[] = [];
    const visit = (n: ts.Node): void => {
      if (
        ts.isCallExpression(n) &&
        ts.isPropertyAccessExpression(n.expression) &&
        n.expression.name.text === "command" &&
        n.arguments[0] &&
        ts.isStringLiteral(n.arguments[0]) &&
        n.arguments[0].text === command
      ) {
        // Walk up the chain: `.command(x).option(...).action(fn)`, or `const cmd = ...; cmd.action(fn)`.
        let top: ts.Node = n;
        while (
          (ts.isPropertyAccessExpression(top.parent) && top.parent.expression === top) ||
          (ts.isCallExpression(top.parent) && top.parent.expression === top)
        ) {
          top = top.parent;
          if (ts.isCallExpression(top) && ts.isPropertyAccessExpression(top.expression)) {
            if (top.expression.name.text === "action" && top.arguments[0]) out.push(top.arguments[0]);
          }
        }
        if (ts.isVariableDeclaration(top.parent) && ts.isIdentifier(top.parent.name)) {
          const sym = this.checker.getSymbolAtLocation(top.parent.name);
          const scope = enclosingFunction(top) ?? file;
          // `cmd.action(fn)`, or a chain that starts from `cmd`, as a receiver or an argument
          // (`options.register(cmd).addOption(...).action(fn)`).
          const fromCmd = (e: ts.Expression): boolean => {
            if (ts.isIdentifier(e)) return this.checker.getSymbolAtLocation(e) === sym;
            if (ts.isPropertyAccessExpression(e)) return fromCmd(e.expression);
            if (ts.isCallExpression(e)) return fromCmd(e.expression) || e.arguments.some((a) => fromCmd(a));
            return false;
          };
          const find = (m: ts.Node): void => {
            if (
              ts.isCallExpression(m) &&
              ts.isPropertyAccessExpression(m.expression) &&
              m.expression.name.text === "action" &&
              fromCmd(m.expression.expression) &&
              m.arguments[0]
            )
              out.push(m.arguments[0]);
            ts.forEachChild(m, find);
          };
          find(scope);
        }
      }
      ts.forEachChild(n, visit);
    };
    visit(file);
    return out;
  }

  /** The declarations in our own source a name resolves to (functions, methods, classes, values). */
  private declarations(id: ts.Node): ts.Node[] {
    let sym = this.checker.getSymbolAtLocation(id);
    if (!sym) return [];
    if (sym.flags & ts.SymbolFlags.Alias) sym = this.checker.getAliasedSymbol(sym);
    const out: ts.Node[] = [];
    for (const d of sym.declarations ?? []) {
      const sf = d.getSourceFile();
      if (sf.isDeclarationFile || !sf.fileName.startsWith(join(this.root, "src"))) continue;
      if (ts.isClassDeclaration(d) || ts.isClassExpression(d)) {
        // A class that is reached has every member reached: methods may be called through an interface.
        out.push(d);
      } else if (
        ts.isFunctionDeclaration(d) ||
        ts.isMethodDeclaration(d) ||
        ts.isGetAccessorDeclaration(d) ||
        ts.isSetAccessorDeclaration(d) ||
        ts.isVariableDeclaration(d) ||
        ts.isPropertyDeclaration(d) ||
        ts.isPropertyAssignment(d) ||
        ts.isShorthandPropertyAssignment(d) ||
        ts.isConstructorDeclaration(d)
      ) {
        out.push(d);
      }
    }
    return out;
  }

  /**
   * `makeInformer(kc, path, listFn)` (client-node's, or ours in src/common/watch.ts that wraps its
   * ListWatch), `new ListWatch(path, watch, listFn)` and the controller runtime's
   * `new Informer({ list, ... })`: their list calls watch too.
   */
  private isInformer(n: ts.CallExpression | ts.NewExpression): boolean {
    const callee = ts.isPropertyAccessExpression(n.expression) ? n.expression.name : n.expression;
    const name = ts.isIdentifier(callee) ? callee.text : "";
    if (name === "Informer") return this.declaredIn(callee, "/src/common/controller/informer.ts");
    if (name !== "makeInformer" && name !== "ListWatch") return false;
    return (
      this.fromClientNode(callee) ||
      (name === "makeInformer" && this.declaredIn(callee, "/src/common/watch.ts"))
    );
  }

  private declaredIn(node: ts.Node, file: string): boolean {
    let sym = this.checker.getSymbolAtLocation(node);
    if (sym && sym.flags & ts.SymbolFlags.Alias) sym = this.checker.getAliasedSymbol(sym);
    return (sym?.declarations ?? []).some((d) => d.getSourceFile().fileName.endsWith(file));
  }

  private fromClientNode(node: ts.Node): boolean {
    let sym = this.checker.getSymbolAtLocation(node);
    if (sym && sym.flags & ts.SymbolFlags.Alias) sym = this.checker.getAliasedSymbol(sym);
    return (sym?.declarations ?? []).some((d) =>
      d.getSourceFile().fileName.includes("/node_modules/@kubernetes/client-node/"),
    );
  }

  /** The generated operation a call runs, if it is a call into one of the library's API classes. */
  private operation(n: ts.CallExpression): Operation | undefined {
    if (!ts.isPropertyAccessExpression(n.expression)) return undefined;
    const sym = this.checker.getSymbolAtLocation(n.expression.name);
    const decl = sym?.declarations?.[0];
    if (!decl || !decl.getSourceFile().fileName.includes("/node_modules/@kubernetes/client-node/"))
      return undefined;
    const cls = decl.parent;
    if (!ts.isClassDeclaration(cls) || !cls.name) return undefined;
    return this.operations.get(cls.name.text.replace(/^Object/, ""))?.get(n.expression.name.text);
  }

  /** The request(s) a call into a generated API class becomes. */
  private apiCall(n: ts.CallExpression, informer: boolean): (Omit<ApiCall, "scope"> & { scope: RawScope })[] {
    const op = this.operation(n)!;
    const site = this.site(n);
    const path = parsePath(op.path);
    if (!path) throw new Error(`${site}: cannot read the API path ${op.path}`);
    const arg = n.arguments[0];
    let groups = [path.group];
    let resources = [path.resource];
    if (path.group === "{group}" || path.resource === "{plural}") {
      groups = this.literalProperty(arg, "group", site);
      resources = this.literalProperty(arg, "plural", site);
    }
    const scopes: RawScope[] = path.namespaced ? this.namespaceScopes(arg, site) : ["cluster"];
    const verb = verbOf(op.method, path.named);
    // A server-side apply of an object that does not exist yet creates it: the API server asks
    // for `create` too.
    const verbs = verb === "patch" && this.isApply(n.arguments[1]) ? [verb, "create"] : [verb];
    const names = path.named ? this.objectNames(arg) : undefined;
    const calls: (Omit<ApiCall, "scope"> & { scope: RawScope })[] = [];
    for (const group of groups)
      for (let resource of resources) {
        if (path.subresource) resource = `${resource}/${path.subresource}`;
        for (const scope of scopes) {
          for (const v of verbs)
            calls.push({
              group,
              resource,
              verb: v,
              scope,
              sites: [site],
              ...(names && v !== "create" ? { names } : {}),
            });
          if (informer && verb === "list")
            calls.push({ group, resource, verb: "watch", scope, sites: [site] });
        }
      }
    return calls;
  }

  /** Whether a call's options (its second argument, or the const that holds them) ask for server-side apply. */
  private isApply(options: ts.Expression | undefined): boolean {
    if (!options) return false;
    const e = skipOuter(options);
    const init = ts.isIdentifier(e) ? this.constInitializer(e) : undefined;
    return /PatchStrategy\.ServerSideApply\b/.test((init ?? e).getText());
  }

  private literalProperty(arg: ts.Expression | undefined, name: string, site: string): string[] {
    const values = arg && this.constantProperty(arg, name);
    if (values?.length) return values;
    throw new Error(`${site}: the ${name} of a custom object call is not a constant`);
  }

  /** The values a string constant can have: a literal, a const, a constant's property, a template, a union of literals. */
  private constant(expr: ts.Expression): string[] | undefined {
    const literal = this.literalTypes(this.checker.getTypeAtLocation(expr));
    if (literal) return literal;
    expr = skipOuter(expr);
    if (ts.isStringLiteral(expr) || ts.isNoSubstitutionTemplateLiteral(expr)) return [expr.text];
    if (ts.isIdentifier(expr)) {
      const init = this.constInitializer(expr);
      return init && this.constant(init);
    }
    if (ts.isPropertyAccessExpression(expr)) return this.constantProperty(expr.expression, expr.name.text);
    if (ts.isTemplateExpression(expr)) {
      let out = [expr.head.text];
      for (const span of expr.templateSpans) {
        const v = this.constant(span.expression);
        if (!v) return undefined;
        out = out.flatMap((o) => v.map((x) => o + x + span.literal.text));
      }
      return out;
    }
    return undefined;
  }

  private constantProperty(obj: ts.Expression, name: string): string[] | undefined {
    obj = skipOuter(obj);
    if (ts.isIdentifier(obj)) {
      const init = this.constInitializer(obj);
      if (init) return this.constantProperty(init, name);
    }
    if (ts.isObjectLiteralExpression(obj)) {
      for (const p of [...obj.properties].reverse()) {
        if (ts.isSpreadAssignment(p)) {
          const v = this.constantProperty(p.expression, name);
          if (v) return v;
        } else if (p.name && ts.isIdentifier(p.name) && p.name.text === name) {
          if (ts.isPropertyAssignment(p)) return this.constant(p.initializer);
          if (ts.isShorthandPropertyAssignment(p)) return this.constant(p.name);
          return undefined;
        }
      }
    }
    const prop = this.checker.getTypeAtLocation(obj).getProperty(name);
    return prop && this.literalTypes(this.checker.getTypeOfSymbolAtLocation(prop, obj));
  }

  private literalTypes(type: ts.Type): string[] | undefined {
    const parts = type.isUnion() ? type.types : [type];
    if (!parts.every((t) => t.isStringLiteral())) return undefined;
    return parts.map((t) => t.value);
  }

  /** The initializer of the `const` an identifier names (through imports). */
  private constInitializer(id: ts.Identifier): ts.Expression | undefined {
    const d = this.valueDeclaration(id);
    if (!d || !ts.isVariableDeclaration(d) || !d.initializer) return undefined;
    if (!(ts.getCombinedNodeFlags(d) & ts.NodeFlags.Const)) return undefined;
    return d.initializer;
  }

  private valueDeclaration(id: ts.Identifier): ts.Declaration | undefined {
    let sym = ts.isShorthandPropertyAssignment(id.parent)
      ? this.checker.getShorthandAssignmentValueSymbol(id.parent)
      : this.checker.getSymbolAtLocation(id);
    if (sym && sym.flags & ts.SymbolFlags.Alias) sym = this.checker.getAliasedSymbol(sym);
    return sym?.valueDeclaration;
  }

  /** Where a namespaced call's `namespace` lands, traced back through locals, parameters (to every reached caller) and fields. */
  private namespaceScopes(arg: ts.Expression | undefined, site: string): RawScope[] {
    if (!arg) throw new Error(`${site}: a namespaced call without arguments`);
    this.propertyLeaf = (obj, name) => this.objectNamespace(obj, name);
    const found = this.propertyValues(arg, "namespace", (e) => this.namespaceLeaf(e), "any", 0);
    this.propertyLeaf = undefined;
    const scopes = found.includes("any") ? (["any"] as RawScope[]) : [...new Set(found)];
    if (process.env.RBAC_DEBUG) process.stderr.write(`${site}: namespace ${scopes.join(",")}\n`);
    return scopes;
  }

  /** The object names a call acts on: constants, a configured name, or names only known at run time. */
  private objectNames(arg: ts.Expression | undefined): string[] | "configured" | undefined {
    if (!arg) return undefined;
    const found = this.propertyValues(arg, "name", (e) => this.nameLeaf(e), "dynamic", 0);
    if (found.includes("dynamic")) return undefined;
    if (found.includes("configured")) return "configured";
    return [...new Set(found)].sort();
  }

  private namespaceLeaf(e: ts.Expression): RawScope | undefined {
    if (ts.isIdentifier(e)) return scopeOfName(e.text);
    if (ts.isCallExpression(e)) {
      const callee = ts.isPropertyAccessExpression(e.expression)
        ? e.expression.name.text
        : e.expression.getText();
      return scopeOfName(callee) ?? "any";
    }
    if (!ts.isPropertyAccessExpression(e)) return undefined;
    const byName = scopeOfName(e.name.text);
    if (byName) return byName;
    if (this.fromConfig(e)) return e.name.text === "namespace" ? "system" : "any";
    // An object's own namespace is where it was read from: settled once the role's reads are known.
    const own = this.objectNamespace(e.expression, e.name.text);
    if (own) return own;
    // A deployment request (or its record) is refused unless its namespace is on the cluster agent's
    // allowlist (Workloads.refusal guards every write): its namespace is a workload namespace.
    if (
      e.name.text === "namespace" &&
      WORKLOAD_TYPES.test(this.checker.typeToString(this.checker.getTypeAtLocation(e.expression)))
    )
      return "workloads";
    return undefined;
  }

  /** `<object>.metadata.namespace`: the namespace of an object of a kind (e.g. a V1Lease). */
  private objectNamespace(holder: ts.Expression, name: string): RawScope | undefined {
    holder = skipOuter(holder);
    if (name !== "namespace" || !ts.isPropertyAccessExpression(holder) || holder.name.text !== "metadata")
      return undefined;
    const type = this.checker.getNonNullableType(this.checker.getTypeAtLocation(holder.expression));
    const kind = /^V1([A-Z]\w*)$/.exec(this.checker.typeToString(type));
    return kind ? `from:${kind[1]!.toLowerCase()}s` : "any";
  }

  /** Set while a namespace is traced: classifies `<obj>.<name>` without an expression for it. */
  private propertyLeaf: ((obj: ts.Expression, name: string) => unknown) | undefined;

  private nameLeaf(e: ts.Expression): string | undefined {
    const c = this.constant(e);
    if (c?.length === 1) return c[0];
    if (ts.isPropertyAccessExpression(e) && this.fromConfig(e)) return "configured";
    if (ts.isCallExpression(e) || ts.isTemplateExpression(e)) return "dynamic";
    if (
      ts.isPropertyAccessExpression(e) &&
      ts.isPropertyAccessExpression(skipOuter(e.expression)) &&
      (skipOuter(e.expression) as ts.PropertyAccessExpression).name.text === "metadata"
    )
      return "dynamic";
    return undefined;
  }

  /** A field of a role's validated configuration (`src/<role>/config.ts`). */
  private fromConfig(e: ts.PropertyAccessExpression): boolean {
    const sym = this.checker.getSymbolAtLocation(e.name);
    return (sym?.declarations ?? []).some((d) =>
      /\/src\/[^/]+\/config\.ts$/.test(d.getSourceFile().fileName),
    );
  }

  /**
   * What an expression can be, traced back: `leaf` classifies an expression when it can; otherwise
   * locals are followed to their initializers, parameters to the matching argument of every reached
   * call, `this.x` to what the constructor gives it, `obj.x` into object literals and spreads.
   * What cannot be followed is `fallback`.
   */
  private values<T>(
    expr: ts.Expression,
    leaf: (e: ts.Expression) => T | undefined,
    fallback: T,
    depth: number,
  ): T[] {
    if (depth > 12) return [fallback];
    expr = skipOuter(expr);
    const known = leaf(expr);
    if (known !== undefined) return [known];
    const next = (e: ts.Expression): T[] => this.values(e, leaf, fallback, depth + 1);
    if (ts.isBinaryExpression(expr)) {
      const op = expr.operatorToken.kind;
      if (op === ts.SyntaxKind.EqualsToken) return next(expr.right);
      if (op === ts.SyntaxKind.BarBarToken || op === ts.SyntaxKind.QuestionQuestionToken)
        return [...next(expr.left), ...next(expr.right)];
    }
    if (ts.isConditionalExpression(expr)) return [...next(expr.whenTrue), ...next(expr.whenFalse)];
    if (ts.isPropertyAccessExpression(expr))
      return this.propertyValues(expr.expression, expr.name.text, leaf, fallback, depth + 1);
    if (ts.isIdentifier(expr)) {
      const d = this.valueDeclaration(expr);
      if (!d) return [fallback];
      if (ts.isVariableDeclaration(d) && d.initializer) return next(d.initializer);
      if (ts.isParameter(d)) return this.parameterValues(d, next, fallback, leaf);
      if (ts.isBindingElement(d)) return this.bindingValues(d, leaf, fallback, depth);
    }
    return [fallback];
  }

  private propertyValues<T>(
    obj: ts.Expression,
    name: string,
    leaf: (e: ts.Expression) => T | undefined,
    fallback: T,
    depth: number,
  ): T[] {
    if (depth > 12) return [fallback];
    obj = skipOuter(obj);
    // `x.metadata` destructured or read whole: the leaf classifies `<obj>.<name>` too.
    const viaLeaf = this.propertyLeaf?.(obj, name) as T | undefined;
    if (viaLeaf !== undefined) return [viaLeaf];
    const next = (e: ts.Expression): T[] => this.values(e, leaf, fallback, depth + 1);
    const inner = (o: ts.Expression): T[] => this.propertyValues(o, name, leaf, fallback, depth + 1);
    if (ts.isObjectLiteralExpression(obj)) {
      for (const p of [...obj.properties].reverse()) {
        if (ts.isSpreadAssignment(p)) {
          const v = inner(p.expression);
          if (!(v.length === 1 && v[0] === fallback)) return v;
        } else if (p.name && ts.isIdentifier(p.name) && p.name.text === name) {
          if (ts.isPropertyAssignment(p)) return next(p.initializer);
          if (ts.isShorthandPropertyAssignment(p)) return next(p.name);
        }
      }
      return [fallback];
    }
    if (obj.kind === ts.SyntaxKind.ThisKeyword) return this.fieldValues(obj, name, next, fallback);
    if (ts.isIdentifier(obj)) {
      const d = this.valueDeclaration(obj);
      if (d && ts.isVariableDeclaration(d) && d.initializer) return inner(d.initializer);
      if (d && ts.isParameter(d)) return this.parameterValues(d, inner, fallback, leaf);
    }
    return [fallback];
  }

  /** A parameter's values: the matching argument at every reached call of its function. */
  private parameterValues<T>(
    p: ts.ParameterDeclaration,
    of: (arg: ts.Expression) => T[],
    fallback: T,
    leaf: (e: ts.Expression) => T | undefined,
  ): T[] {
    const fn = p.parent;
    // `namespaces.map((namespace) => ...)`: an element of what is mapped.
    if (
      ts.isArrowFunction(fn) &&
      ts.isCallExpression(fn.parent) &&
      ts.isPropertyAccessExpression(fn.parent.expression)
    ) {
      const list = fn.parent.expression.expression;
      const v = leaf(list);
      if (v !== undefined) return [v];
    }
    const index = fn.parameters.indexOf(p);
    const sites = this.callSites.get(fn) ?? [];
    if (sites.length === 0) return [fallback];
    return sites.flatMap((s) => {
      const a = s.arguments?.[index];
      return a ? of(a) : [fallback];
    });
  }

  private bindingValues<T>(
    b: ts.BindingElement,
    leaf: (e: ts.Expression) => T | undefined,
    fallback: T,
    depth: number,
  ): T[] {
    const key = b.propertyName && ts.isIdentifier(b.propertyName) ? b.propertyName.text : b.name.getText();
    const holder = b.parent.parent;
    const inner = (o: ts.Expression): T[] => this.propertyValues(o, key, leaf, fallback, depth + 1);
    if (ts.isParameter(holder)) return this.parameterValues(holder, inner, fallback, leaf);
    if (ts.isVariableDeclaration(holder) && holder.initializer) return inner(holder.initializer);
    return [fallback];
  }

  /** `this.name`: its initializer, or what the constructor assigns it (a parameter property or `this.name = ...`). */
  private fieldValues<T>(
    self: ts.Expression,
    name: string,
    next: (e: ts.Expression) => T[],
    fallback: T,
  ): T[] {
    let cls: ts.Node | undefined = self;
    while (cls && !ts.isClassLike(cls)) cls = cls.parent;
    if (!cls) return [fallback];
    const out: T[] = [];
    for (const m of cls.members) {
      if (ts.isPropertyDeclaration(m) && m.name.getText() === name && m.initializer)
        out.push(...next(m.initializer));
      if (ts.isConstructorDeclaration(m)) {
        for (const p of m.parameters)
          if (p.name.getText() === name && ts.getModifiers(p)?.length)
            out.push(...this.parameterValues(p, next, fallback, () => undefined));
        const assign = (n: ts.Node): void => {
          if (
            ts.isBinaryExpression(n) &&
            n.operatorToken.kind === ts.SyntaxKind.EqualsToken &&
            ts.isPropertyAccessExpression(n.left) &&
            n.left.expression.kind === ts.SyntaxKind.ThisKeyword &&
            n.left.name.text === name
          )
            out.push(...next(n.right));
          ts.forEachChild(n, assign);
        };
        if (m.body) assign(m.body);
      }
    }
    return out.length ? out : [fallback];
  }

  private site(n: ts.Node): string {
    const sf = n.getSourceFile();
    const { line } = sf.getLineAndCharacterOfPosition(n.getStart());
    return `${relative(this.root, sf.fileName)}:${line + 1}`;
  }
}

const WORKLOAD_TYPES = /^(RequestRecord|DeploymentRequest)\b/;

/** Names the roles give their configured namespaces. */
function scopeOfName(name: string): Scope | undefined {
  if (/^(systemNamespace|SYSTEM_NAMESPACE|secretNamespace)$/.test(name)) return "system";
  if (/^(workloadNamespace|namespaces|targetNamespace)$/.test(name)) return "workloads";
  return undefined;
}

function skipOuter(e: ts.Expression): ts.Expression {
  while (
    ts.isNonNullExpression(e) ||
    ts.isAsExpression(e) ||
    ts.isParenthesizedExpression(e) ||
    ts.isSatisfiesExpression(e)
  )
    e = e.expression;
  return e;
}

function enclosingFunction(n: ts.Node): ts.Node | undefined {
  for (let p = n.parent; p; p = p.parent) if (ts.isFunctionLike(p)) return p;
  return undefined;
}

function verbOf(method: string, named: boolean): string {
  switch (method) {
    case "GET":
      return named ? "get" : "list";
    case "POST":
      return "create";
    case "PUT":
      return "update";
    case "PATCH":
      return "patch";
    case "DELETE":
      return named ? "delete" : "deletecollection";
    default:
      throw new Error(`unknown HTTP method ${method}`);
  }
}

export function parsePath(
  path: string,
):
  { group: string; resource: string; subresource?: string; namespaced: boolean; named: boolean } | undefined {
  const m = /^\/(?:api\/v1|apis\/([^/]+)\/[^/]+)\/(.+)$/.exec(path);
  if (!m) return undefined;
  const group = m[1] ?? "";
  let parts = m[2]!.split("/");
  let namespaced = false;
  if (parts[0] === "namespaces" && parts[1] === "{namespace}" && parts.length > 2) {
    namespaced = true;
    parts = parts.slice(2);
  }
  const resource = parts[0]!;
  const named = parts[1]?.startsWith("{") ?? false;
  const subresource = named ? parts[2] : undefined;
  return { group, resource, subresource, namespaced, named };
}

/** Method name -> operation, per API class, read from the library's generated request factories. */
function readOperations(root: string): Map<string, Map<string, Operation>> {
  const require = createRequire(join(root, "package.json"));
  const dir = join(dirname(require.resolve("@kubernetes/client-node")), "gen", "apis");
  const out = new Map<string, Map<string, Operation>>();
  for (const f of readdirSync(dir).filter((x) => x.endsWith("Api.js"))) {
    const text = readFileSync(join(dir, f), "utf8");
    const factory = text.slice(0, text.indexOf("ResponseProcessor {"));
    const ops = new Map<string, Operation>();
    const re =
      /\n {4}async (\w+)\([^)]*\) \{[\s\S]*?const localVarPath = '([^']+)'[\s\S]*?HttpMethod\.(\w+)\)/g;
    for (const m of factory.matchAll(re)) ops.set(m[1]!, { path: m[2]!, method: m[3]! });
    out.set(f.slice(0, -3), ops);
  }
  return out;
}

/**
 * A call on an object's own namespace lands where the role reads such objects: the system
 * namespace when every get, list and watch of that resource is there, any namespace otherwise.
 */
function settleObjectNamespaces(calls: (Omit<ApiCall, "scope"> & { scope: RawScope })[]): ApiCall[] {
  const readScopes = (resource: string): Set<RawScope> =>
    new Set(
      calls
        .filter((c) => c.resource === resource && ["get", "list", "watch"].includes(c.verb))
        .map((c) => c.scope),
    );
  return calls.map((c) => {
    if (!c.scope.startsWith("from:")) return c as ApiCall;
    const reads = readScopes(c.scope.slice("from:".length));
    const scope: Scope = reads.size === 1 && reads.has("system") ? "system" : "any";
    return { ...c, scope };
  });
}

/** One entry per (group, resource, verb, scope): its sites together, its names merged (any name wins). */
function dedupe(calls: ApiCall[]): ApiCall[] {
  const seen = new Map<string, ApiCall>();
  for (const c of calls) {
    const k = `${c.group}|${c.resource}|${c.verb}|${c.scope}`;
    const had = seen.get(k);
    if (!had) {
      seen.set(k, { ...c, sites: [...c.sites] });
      continue;
    }
    for (const s of c.sites) if (!had.sites.includes(s)) had.sites.push(s);
    if (!had.names || !c.names) delete had.names;
    else if (had.names === "configured" || c.names === "configured") had.names = "configured";
    else had.names = [...new Set([...had.names, ...c.names])].sort();
  }
  return [...seen.values()].sort((a, b) => callKey(a).localeCompare(callKey(b)));
}

export const callKey = (c: Pick<ApiCall, "scope" | "group" | "resource" | "verb">): string =>
  `${c.scope} ${c.group || "core"} ${c.resource} ${c.verb}`;
