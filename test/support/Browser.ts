import { existsSync, mkdirSync, rmSync, statSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import Chromium from "@sparticuz/chromium"
import { Context, Effect, Layer } from "effect"
import { type Browser, chromium, type Page } from "playwright-core"

const READY = join(tmpdir(), "chromium.svc-ready")
const LOCK = join(tmpdir(), "chromium.svc-lock")
const STALE_LOCK_MS = 120_000

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/**
 * The Chromium binary `@sparticuz/chromium` ships (brotli-packed in the npm package, so nothing is
 * downloaded), unpacked once per machine into the temp folder. The package checks only that the binary's
 * path exists, so two test processes unpacking at once could start a half-written file: one unpacks under
 * a lock directory while the others wait for its ready mark.
 */
const executablePath = async (): Promise<string> => {
  for (;;) {
    if (existsSync(READY) && existsSync(join(tmpdir(), "chromium"))) return Chromium.executablePath()
    try {
      mkdirSync(LOCK)
    } catch {
      const age = Date.now() - (existsSync(LOCK) ? statSync(LOCK).mtimeMs : Date.now())
      if (age > STALE_LOCK_MS) rmSync(LOCK, { recursive: true, force: true })
      await sleep(200)
      continue
    }
    try {
      const path = await Chromium.executablePath()
      writeFileSync(READY, path)
      return path
    } finally {
      rmSync(LOCK, { recursive: true, force: true })
    }
  }
}

/** One headless Chromium for a test file, driven by playwright-core; closed with the layer. */
export class TestBrowser extends Context.Service<TestBrowser, Browser>()("test/TestBrowser") {
  static readonly layer = Layer.effect(
    TestBrowser,
    Effect.acquireRelease(
      Effect.promise(async () =>
        chromium.launch({ executablePath: await executablePath(), args: Chromium.args, headless: true })
      ),
      (browser) => Effect.promise(() => browser.close())
    )
  )
}

/**
 * A fresh page (its own browser context: no cookies or storage shared between tests), closed with the
 * scope. `prepare` runs before any navigation, for `addInitScript` and `exposeFunction`.
 */
export const openPage = (prepare: (page: Page) => Promise<void> = async () => {}) =>
  Effect.gen(function* () {
    const browser = yield* TestBrowser
    const context = yield* Effect.acquireRelease(
      Effect.promise(() => browser.newContext()),
      (context) => Effect.promise(() => context.close())
    )
    const page = yield* Effect.promise(() => context.newPage())
    yield* Effect.promise(() => prepare(page))
    return page
  })
