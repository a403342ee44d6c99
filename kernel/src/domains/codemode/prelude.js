// CodeMode's globals, defined before the block runs. `host(call, argsJson)`
// performs one syscall of the process and resolves to `{"value": …}` or
// `{"error": "…"}`; `log(line)` keeps a console line.
(function (host, log, metaJson, code) {
  "use strict";
  const meta = JSON.parse(metaJson);
  const g = globalThis;
  const call = async (name, args) => {
    const out = JSON.parse(
      await host(String(name), JSON.stringify(args === undefined ? {} : args)),
    );
    if ("error" in out) throw new Error(out.error);
    return out.value;
  };
  const text = (v) => {
    if (typeof v === "string") return v;
    if (v instanceof Error) return String(v);
    try {
      const s = JSON.stringify(v);
      return s === undefined ? String(v) : s;
    } catch (_) {
      return String(v);
    }
  };
  const line = (...a) => log(a.map(text).join(" "));
  g.console = { log: line, info: line, warn: line, error: line, debug: line };

  const withTarget = (a) =>
    meta.target && a.target === undefined ? { ...a, target: meta.target } : a;
  const fsArgs = (a) => withTarget(typeof a === "string" ? { path: a } : { ...(a || {}) });
  g.fs = Object.freeze({
    read: (a) => call("fs.read", fsArgs(a)),
    write: (a, content) =>
      call("fs.write", typeof a === "string" ? withTarget({ path: a, content }) : fsArgs(a)),
    edit: (a) => call("fs.edit", fsArgs(a)),
    delete: (a) => call("fs.delete", fsArgs(a)),
    search: (a) =>
      call("fs.search", typeof a === "string" ? withTarget({ query: a }) : fsArgs(a)),
  });
  g.shell = (input, opts) => {
    const a = withTarget({ ...(opts || {}), input: input === undefined ? "" : String(input) });
    if (meta.cwd && a.cwd === undefined) a.cwd = meta.cwd;
    return call("shell.exec", a);
  };
  g.syscall = (name, args) => call(name, args);

  // MCP results: structured content as is, text parsed as JSON when it
  // is JSON, tool errors thrown.
  const unwrap = (r) => {
    const blocks = Array.isArray(r.content) ? r.content : [];
    const texts = blocks.filter((b) => b && b.type === "text").map((b) => b.text);
    if (r.isError) throw new Error(texts.join("\n") || "the MCP tool failed");
    if (r.structuredContent !== undefined && r.structuredContent !== null) {
      return r.structuredContent;
    }
    if (texts.length > 0 && texts.length === blocks.length) {
      const t = texts.join("\n");
      try {
        return JSON.parse(t);
      } catch (_) {
        return t;
      }
    }
    return r.content;
  };
  for (const t of meta.mcpTools) {
    const f = async (a) =>
      unwrap(
        await call("sys.mcp.call", { serverId: t.serverId, name: t.tool, arguments: a || {} }),
      );
    g[t.alias] = f;
    // A tool named like a global (`JSON`, `shell`) keeps only its alias.
    if (t.name && !(t.name in g)) g[t.name] = f;
    else t.name = null;
  }
  g.mcpTools = meta.mcpTools;
  g.argv = meta.argv;
  g.args = meta.args === null || meta.args === undefined ? {} : meta.args;

  const AsyncFunction = (async function () {}).constructor;
  return new AsyncFunction(code)();
});
