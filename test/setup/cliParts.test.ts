import { execFileSync } from "node:child_process"
import { mkdirSync, statSync } from "node:fs"
import { join } from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import fc from "fast-check"
import jsQRModule from "jsqr"
import { maskKey, parseDuration } from "../../src/cli/Format.ts"
import { harnessConfig } from "../../src/cli/HarnessConfig.ts"
import { writeOwnerOnly } from "../../src/cli/OwnerOnlyFiles.ts"
import { Unreachable, waitForKey } from "../../src/cli/Polling.ts"
import { renderQr } from "../../src/cli/Qr.ts"
import { DeviceFlowError, type DeviceFlowErrorCode, HARNESSES } from "../../src/domain/Setup.ts"
import { newUserCode, normalizeUserCode } from "../../src/setup/DeviceFlow.ts"
import { scratchDirForTest } from "../support/Scratch.ts"

// A CommonJS package: Node's default import is `module.exports`, which also carries `default`.
const jsQR = jsQRModule.default

/** Reads a rendered terminal QR code back as pixels (4 per module) and decodes it. */
const decodeTerminalQr = (rendered: string) => {
  const lines = rendered.split("\n")
  const rows: Array<Array<boolean>> = []
  for (const line of lines) {
    const chars = [...line]
    rows.push(chars.map((c) => c === "█" || c === "▀"))
    rows.push(chars.map((c) => c === "█" || c === "▄"))
  }
  const scale = 4
  const width = rows[0]!.length * scale
  const height = rows.length * scale
  const pixels = new Uint8ClampedArray(width * height * 4)
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const dark = rows[Math.floor(y / scale)]![Math.floor(x / scale)]
      pixels.fill(dark ? 0 : 255, (y * width + x) * 4, (y * width + x) * 4 + 3)
      pixels[(y * width + x) * 4 + 3] = 255
    }
  }
  return jsQR(pixels, width, height)?.data
}

describe("svc-setup's parts", () => {
  it("the terminal QR code decodes to the approval URL", () => {
    fc.assert(
      fc.property(fc.webUrl({ withQueryParameters: true }), (url) => {
        assert.strictEqual(decodeTerminalQr(renderQr(url, { ansi: false })), url)
      }),
      { numRuns: 10 }
    )
    const ansi = renderQr("http://127.0.0.1:8402/setup?code=BCDF-GHJK", { ansi: true })
    const first = ansi.split("\n")[0]!
    assert.isTrue(
      first.startsWith("\u001b[30;47m") && first.endsWith("\u001b[0m"),
      "black on white on any theme"
    )
  })

  it("user codes: every drawn code survives case, dashes and spaces; nothing else passes", () => {
    fc.assert(
      fc.property(fc.boolean(), fc.constantFrom("", "-", " ", "  "), (lower, sep) => {
        const code = newUserCode()
        const typed = `${code.slice(0, 4)}${sep}${code.slice(5)}`
        assert.strictEqual(normalizeUserCode(lower ? typed.toLowerCase() : typed), code)
      })
    )
    for (const bad of ["BCDF-GHJ", "BCDF-GHJKL", "ABCD-EFGH", "BCDF-GHJ1", ""]) {
      assert.isUndefined(normalizeUserCode(bad), bad)
    }
  })

  it("durations and masked keys", () => {
    assert.strictEqual(parseDuration("90m"), 5_400)
    assert.strictEqual(parseDuration("12h"), 43_200)
    assert.strictEqual(parseDuration("30d"), 2_592_000)
    assert.strictEqual(parseDuration("2w"), 1_209_600)
    assert.strictEqual(parseDuration("3600"), 3_600)
    assert.isUndefined(parseDuration("1.5d"))
    assert.isUndefined(parseDuration("soon"))
    const secret = "svc_ck_0123456789abcdefghijklmnopqrstuvwxyzABCDEFG"
    const masked = maskKey(secret)
    assert.strictEqual(masked, "svc_ck_0123…DEFG")
    assert.notInclude(secret, masked.replace("…", ""))
  })

  it("every harness: the file, sourced by a shell, carries the URL and key; the printed lines never do", () => {
    const secret = `svc_ck_it's-"quoted"-$HOME-\`x\``
    for (const harness of HARNESSES) {
      const dir = scratchDirForTest("svc-harness-")
      const config = harnessConfig({
        routerUrl: "http://router.test:8402",
        secret,
        configDir: dir,
        harness,
        about: "Key key_1."
      })
      assert.notInclude(config.instructions.join("\n"), secret, harness)
      const env = config.files.find((f) => f.name === `${harness}.env`)!
      const vars = execFileSync("bash", ["--norc", "--noprofile", "-c", `${env.content}\nenv`], {
        encoding: "utf8",
        env: {}
      })
      assert.include(vars, `SVC_CREDIT_KEY=${secret}\n`, harness)
      assert.include(vars, "SVC_ROUTER_URL=http://router.test:8402\n", harness)
      const expected: Record<string, ReadonlyArray<string>> = {
        "claude-code": [
          "ANTHROPIC_BASE_URL=http://router.test:8402\n",
          `ANTHROPIC_CUSTOM_HEADERS=x-credit-key: ${secret}\n`
        ],
        codex: [],
        opencode: [],
        aider: ["OPENAI_API_BASE=http://router.test:8402/v1\n"],
        "generic-openai": [
          "OPENAI_BASE_URL=http://router.test:8402/v1\n",
          "ANTHROPIC_BASE_URL=http://router.test:8402\n"
        ]
      }
      for (const line of expected[harness]!) assert.include(vars, line, harness)
      assert.include(config.instructions.join("\n"), `source ${dir}/${harness}.env`)
    }
    const codex = harnessConfig({
      routerUrl: "http://r",
      secret,
      configDir: "/c",
      harness: "codex",
      about: ""
    })
    assert.include(codex.instructions.join("\n"), 'env_http_headers = { "x-credit-key" = "SVC_CREDIT_KEY" }')
    const aider = harnessConfig({
      routerUrl: "http://r",
      secret,
      configDir: "/c",
      harness: "aider",
      about: ""
    })
    assert.include(aider.files[1]!.content, `x-credit-key: ${JSON.stringify(secret)}`)
  })

  it.effect("files are owner-only from the start, and never written inside a git work tree", () =>
    Effect.gen(function* () {
      const root = scratchDirForTest("svc-owner-")
      const dir = join(root, "deep", "config")
      const written = yield* writeOwnerOnly(dir, [{ name: "a.env", content: "export A=1\n" }])
      assert.deepStrictEqual(written, [join(dir, "a.env")])
      assert.strictEqual(statSync(dir).mode & 0o777, 0o700)
      assert.strictEqual(statSync(written[0]!).mode & 0o777, 0o600)
      // Written again (a second setup for the same harness): replaced, still owner-only.
      yield* writeOwnerOnly(dir, [{ name: "a.env", content: "export A=2\n" }])
      assert.strictEqual(statSync(written[0]!).mode & 0o777, 0o600)

      const repo = join(root, "repo")
      mkdirSync(join(repo, ".git"), { recursive: true })
      const refused = yield* Effect.flip(
        writeOwnerOnly(join(repo, "nested", "keys"), [{ name: "a.env", content: "" }])
      )
      assert.include(refused.message, "inside the git repository")
    }).pipe(Effect.provide(NodeServices.layer))
  )

  it.effect(
    "polls at the interval, 5 s more after each slow_down, backs off when unreachable, stops on denial",
    () =>
      Effect.gen(function* () {
        const script: Array<DeviceFlowErrorCode | "unreachable" | "issued"> = [
          "authorization_pending",
          "slow_down",
          "authorization_pending",
          "unreachable",
          "unreachable",
          "authorization_pending",
          "issued"
        ]
        const times: Array<number> = []
        const exchange: Effect.Effect<string, DeviceFlowError | Unreachable> = Effect.gen(function* () {
          times.push(yield* Clock.currentTimeMillis)
          const next = script.shift()!
          if (next === "issued") return "key"
          if (next === "unreachable") return yield* new Unreachable({ message: "down" })
          return yield* new DeviceFlowError({ error: next, error_description: next })
        })
        const fiber = yield* Effect.forkChild(
          waitForKey({ intervalSeconds: 5, expiresInSeconds: 600, exchange })
        )
        yield* TestClock.adjust("10 minutes")
        assert.strictEqual(yield* Fiber.join(fiber), "key")
        const gaps = times.map((t, i) => (t - (i === 0 ? 0 : times[i - 1]!)) / 1000)
        // 5 s; pending → 5; slow_down → 10; pending → 10; unreachable doubles → 20, 40; then the interval again.
        assert.deepStrictEqual(gaps, [5, 5, 10, 10, 20, 40, 10])

        const denied = yield* Effect.forkChild(
          waitForKey({
            intervalSeconds: 5,
            expiresInSeconds: 600,
            exchange: Effect.fail(new DeviceFlowError({ error: "access_denied", error_description: "no" }))
          })
        )
        yield* TestClock.adjust("5 seconds")
        const failure = yield* Effect.flip(Fiber.join(denied))
        assert.include(failure.message, "denied")

        const forever = yield* Effect.forkChild(
          waitForKey({
            intervalSeconds: 5,
            expiresInSeconds: 12,
            exchange: Effect.fail(
              new DeviceFlowError({ error: "authorization_pending", error_description: "" })
            )
          })
        )
        yield* TestClock.adjust("15 seconds")
        assert.include((yield* Effect.flip(Fiber.join(forever))).message, "expired")
      })
  )
})
