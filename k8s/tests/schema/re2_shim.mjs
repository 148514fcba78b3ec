// Stand-in for re2-wasm (which loads a .wasm file from disk): JavaScript's
// RegExp, with RE2's inline (?i) turned into the i flag.
export class RE2 extends RegExp {
  constructor(pattern, flags) {
    let p = String(pattern), f = flags || "";
    if (p.includes("(?i)")) { p = p.split("(?i)").join(""); if (!f.includes("i")) f += "i"; }
    let r;
    try { r = new RegExp(p, f); } catch { r = new RegExp(p, f.replace("u", "")); }
    super(r.source, r.flags);
  }
}
