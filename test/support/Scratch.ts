import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { onTestFinished } from "vitest"

const make = (prefix: string) => mkdtempSync(join(tmpdir(), prefix))
const remove = (dir: string) => rmSync(dir, { recursive: true, force: true })

/** A fresh temporary directory, removed when the scope closes. */
export const scratchDir = (prefix: string) =>
  Effect.acquireRelease(
    Effect.sync(() => make(prefix)),
    (dir) => Effect.sync(() => remove(dir))
  )

/** A fresh temporary directory, removed when the current test finishes (passed or failed). */
export const scratchDirForTest = (prefix: string) => {
  const dir = make(prefix)
  onTestFinished(() => remove(dir))
  return dir
}
