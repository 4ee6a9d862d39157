// Builds the volunteer page into static/, the folder the coordinator serves at
// `/` and the Python package ships (so a `pip install` needs no node):
// bundles src/page.js and src/worker.js with esbuild, copies page/*.
// `node build.mjs --check` builds into a temporary folder and fails when
// static/ differs (CI: the committed bundle must be what the sources build).
// kernels.wasm comes from wasm/build.sh, checked the same way.
import * as esbuild from "esbuild";
import { mkdtempSync, readFileSync, writeFileSync, copyFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const check = process.argv.includes("--check");
const out = check ? mkdtempSync(join(tmpdir(), "crowdgrad-web-")) : join(here, "static");

const BUNDLES = {
  "page.js": "src/page.js",
  "worker.js": "src/worker.js",
  "bench.js": "src/bench.js",
  "dashboard.js": "src/dashboard.js",
  "desktop.js": "src/desktop.js",
};
/** static name -> source, relative to client/web */
const COPIES = {
  "index.html": "page/index.html",
  "style.css": "page/style.css",
  "dashboard.html": "page/dashboard.html",
  "dashboard.css": "page/dashboard.css",
  "uplot.css": "node_modules/uplot/dist/uPlot.min.css",
};

for (const [name, entry] of Object.entries(BUNDLES)) {
  await esbuild.build({
    entryPoints: [join(here, entry)],
    outfile: join(out, name),
    bundle: true,
    format: "iife",
    target: ["chrome110", "firefox115", "safari16"],
    minify: true,
    legalComments: "none",
    logLevel: "warning",
    // The sources are type-checked by tsconfig.json (tsc); the bundle depends on
    // none of its options (its "strict" would make esbuild add "use strict").
    tsconfigRaw: {},
    banner: { js: "// crowdgrad volunteer client: built by client/web/build.mjs from client/web/src; do not edit." },
  });
}
for (const [name, from] of Object.entries(COPIES)) copyFileSync(join(here, from), join(out, name));

if (check) {
  const differ = [];
  for (const name of [...Object.keys(BUNDLES), ...Object.keys(COPIES)]) {
    let committed = null;
    try {
      committed = readFileSync(join(here, "static", name));
    } catch {
      // missing: differs
    }
    if (committed === null || !committed.equals(readFileSync(join(out, name)))) differ.push(name);
  }
  rmSync(out, { recursive: true, force: true });
  if (differ.length > 0) {
    console.error(`client/web/static differs from a fresh build: ${differ.join(", ")}; run \`make web\` and commit`);
    process.exit(1);
  }
  console.log("client/web/static matches its sources");
} else {
  console.log(`built ${readdirSync(out).join(", ")} in client/web/static`);
}
