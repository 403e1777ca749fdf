// A small syntax highlighter for unified diffs: each line is coloured as added, removed, hunk
// or header, and the code in it is tokenized (keywords, strings, comments, numbers, calls) by
// a few rules per language family, chosen by the file's extension. Written for agent-2pc;
// no dependency. Text is escaped before any markup is added.
"use strict";
(function () {
  const KW = {
    py: "and as assert async await break class continue def del elif else except False finally for from global if import in is lambda None nonlocal not or pass raise return True try while with yield self match case",
    js: "async await break case catch class const continue debugger default delete do else export extends false finally for from function if import in instanceof let new null of return static super switch this throw true try typeof undefined var void while with yield interface type enum implements",
    rs: "as async await break const continue crate else enum extern false fn for if impl in let loop match mod move mut pub ref return self Self static struct super trait true type unsafe use where while dyn Some None Ok Err",
    go: "break case chan const continue default defer else fallthrough for func go goto if import interface map package range return select struct switch type var nil true false",
    c: "auto break case char const continue default do double else enum extern float for goto if inline int long register return short signed sizeof static struct switch typedef union unsigned void volatile while bool true false class public private protected namespace template typename new delete nullptr include define",
    sh: "if then else elif fi case esac for while until do done in function return local export set unset echo exit",
    java: "abstract boolean break byte case catch char class const continue default do double else enum extends final finally float for if implements import instanceof int interface long native new null package private protected public return short static super switch synchronized this throw throws try void volatile while true false var record",
    rb: "begin break case class def do else elsif end ensure false for if in module next nil not or redo rescue retry return self super then true undef unless until when while yield require",
  };
  const EXT = { py: "py", pyi: "py", js: "js", mjs: "js", cjs: "js", ts: "js", tsx: "js", jsx: "js",
    rs: "rs", go: "go", c: "c", h: "c", cc: "c", cpp: "c", hpp: "c", cs: "java", java: "java",
    kt: "java", swift: "java", sh: "sh", bash: "sh", zsh: "sh", rb: "rb", json: "json",
    toml: "conf", yaml: "conf", yml: "conf", ini: "conf", cfg: "conf", md: "md" };
  const HASH_COMMENT = { py: 1, sh: 1, rb: 1, conf: 1 };
  const sets = {};
  for (const k in KW) sets[k] = new Set(KW[k].split(" "));

  function esc(s) {
    return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }
  function span(cls, text) { return '<span class="tk-' + cls + '">' + esc(text) + "</span>"; }

  function langOf(path) {
    const m = /\.([A-Za-z0-9]+)$/.exec(path || "");
    return m ? EXT[m[1].toLowerCase()] || null : null;
  }

  // Tokenize one line of code (no state across lines: a multi-line string or comment is
  // coloured line by line, which is good enough for a diff).
  function code(line, lang) {
    if (!lang) return esc(line);
    if (lang === "md") {
      if (/^#{1,6}\s/.test(line)) return span("t", line);
      return esc(line);
    }
    const kw = sets[lang === "json" ? "js" : lang] || new Set();
    const hash = HASH_COMMENT[lang];
    const re = hash
      ? /(#.*$)|("(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?)|(\b\d[\d_]*(?:\.\d+)?(?:e[+-]?\d+)?\b|\b0x[0-9a-fA-F]+\b)|([A-Za-z_][A-Za-z0-9_]*)(?=\s*\()|([A-Za-z_$][A-Za-z0-9_$]*)/g
      : /(\/\/.*$|\/\*.*?(?:\*\/|$))|("(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?|`(?:[^`\\]|\\.)*`?)|(\b\d[\d_]*(?:\.\d+)?(?:e[+-]?\d+)?\b|\b0x[0-9a-fA-F]+\b)|([A-Za-z_$][A-Za-z0-9_$]*)(?=\s*\()|([A-Za-z_$][A-Za-z0-9_$]*)/g;
    let out = "", last = 0, m;
    while ((m = re.exec(line)) !== null) {
      if (m[0] === "") { re.lastIndex++; continue; }
      out += esc(line.slice(last, m.index));
      if (m[1]) out += span("c", m[1]);
      else if (m[2]) out += span("s", m[2]);
      else if (m[3]) out += span("n", m[3]);
      else if (m[4]) out += kw.has(m[4]) ? span("k", m[4]) : span("f", m[4]);
      else if (m[5]) out += kw.has(m[5]) ? span("k", m[5]) : (/^[A-Z][a-z]/.test(m[5]) && lang !== "json" ? span("t", m[5]) : esc(m[5]));
      last = re.lastIndex;
    }
    return out + esc(line.slice(last));
  }

  // A unified diff (git style) as HTML lines.
  function diff(text) {
    const lines = text.split("\n");
    if (lines.length && lines[lines.length - 1] === "") lines.pop();
    let lang = null, out = [];
    for (const line of lines) {
      let cls = "", body;
      if (line.startsWith("diff --git ")) {
        const m = / b\/(.*)$/.exec(line);
        lang = langOf(m ? m[1] : "");
        cls = "file"; body = esc(line);
      } else if (/^(index |new file mode|deleted file mode|old mode|new mode|similarity|rename |Binary files|# empty directory|Large file)/.test(line)) {
        cls = "meta"; body = esc(line);
      } else if (line.startsWith("--- ") || line.startsWith("+++ ")) {
        cls = "meta"; body = esc(line);
      } else if (line.startsWith("@@")) {
        cls = "hunk"; body = esc(line);
      } else if (line.startsWith("+")) {
        cls = "add"; body = '<span class="sign">+</span>' + code(line.slice(1), lang);
      } else if (line.startsWith("-")) {
        cls = "del"; body = '<span class="sign">-</span>' + code(line.slice(1), lang);
      } else if (line.startsWith("\\")) {
        cls = "meta"; body = esc(line);
      } else {
        body = '<span class="sign"> </span>' + code(line.slice(1), lang);
      }
      out.push('<span class="ln ' + cls + '">' + body + "</span>");
    }
    return out.join("");
  }

  window.A2Highlight = { diff: diff, code: code, esc: esc, langOf: langOf };
})();
