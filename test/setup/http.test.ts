import { existsSync } from "node:fs"
import { join } from "node:path"
import { assert, describe, layer } from "@effect/vitest"
import { ConfigProvider, Effect, Layer } from "effect"
import { privateKeyToAccount } from "viem/accounts"
import { Chain } from "../../src/chain/Chain.ts"
import { DEVICE_CODE_GRANT } from "../../src/domain/Setup.ts"
import { balanceWith, errorCode, invite, signedCall } from "../keys/support.ts"
import { waitFor } from "../support/Pay.ts"
import { call, postJson, RouterUrl, routerLayer } from "../support/Router.ts"
import { scratchDirForTest } from "../support/Scratch.ts"
import { printedUserCode, runCli } from "./cli.ts"
import { signTypedDataJson } from "./support.ts"

/** Polled every second (AGENT_SETUP_INTERVAL_SECONDS), so the command's tests wait one second, not five. */
const router = routerLayer().pipe(
  Layer.provide(
    ConfigProvider.layerAdd(ConfigProvider.fromUnknown({ AGENT_SETUP_INTERVAL_SECONDS: "1" }), {
      asPrimary: true
    })
  )
)

interface Started {
  readonly device_code: string
  readonly user_code: string
  readonly verification_uri: string
  readonly verification_uri_complete: string
  readonly expires_in: number
  readonly interval: number
  readonly setup: { readonly typed_data: { readonly message: Record<string, string> } }
}

const token = (body: Record<string, string>, form = false) =>
  call("/v1/agent-setup/token", {
    method: "POST",
    headers: { "content-type": form ? "application/x-www-form-urlencoded" : "application/json" },
    body: form ? new URLSearchParams(body).toString() : JSON.stringify(body)
  })

describe("agent setup over HTTP", () => {
  layer(router, { timeout: 120_000, excludeTestServices: true })((it) => {
    it.effect("RFC 8628 wire: start, view, approve as a browser wallet signs, form-encoded exchange", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const wallet = privateKeyToAccount(chain.demoWallets[0]!.privateKey!)
        yield* invite(wallet.address)

        const start = yield* postJson("/v1/agent-setup/sessions", {
          harness: "codex",
          budget_usdc: "2.5",
          key_expires_in: 86_400
        })
        assert.strictEqual(start.status, 201, start.text)
        const started = start.json as Started
        assert.match(started.verification_uri, /\/setup$/)
        assert.strictEqual(
          started.verification_uri_complete,
          `${started.verification_uri}?code=${started.user_code}`
        )
        assert.strictEqual(started.expires_in, 600)
        assert.strictEqual(started.interval, 1)

        const pending = yield* token({ grant_type: DEVICE_CODE_GRANT, device_code: started.device_code })
        assert.strictEqual(pending.status, 400)
        assert.deepStrictEqual(Object.keys(pending.json as object).sort(), ["error", "error_description"])
        assert.strictEqual((pending.json as { error: string }).error, "authorization_pending")

        const viewed = yield* call(`/v1/agent-setup/sessions/${started.user_code.toLowerCase()}`)
        assert.strictEqual(viewed.status, 200, viewed.text)
        const view = viewed.json as Started["setup"] & Record<string, unknown>
        assert.deepInclude(view, {
          object: "agent_setup",
          status: "pending",
          harness: "codex",
          harness_name: "Codex CLI",
          budget: 2_500_000,
          budget_usdc: "2.500000",
          network: chain.network,
          chain_id: chain.chainId
        })

        // Exactly what the page does: the served typed data, wallet and budget filled in, as JSON.
        const typed = view.typed_data
        const json = JSON.stringify({
          ...typed,
          message: { ...typed.message, wallet: wallet.address, budget: "2000000" }
        })
        const signature = yield* signTypedDataJson(wallet, json)
        const approve = yield* postJson(`/v1/agent-setup/sessions/${started.user_code}/approve`, {
          wallet: wallet.address,
          budget: 2_000_000,
          signature
        })
        assert.strictEqual(approve.status, 200, approve.text)
        assert.deepInclude(approve.json as object, {
          status: "approved",
          approved_budget: 2_000_000,
          approved_budget_usdc: "2.000000",
          approved_by: wallet.address.toLowerCase()
        })
        const replay = yield* postJson(`/v1/agent-setup/sessions/${started.user_code}/approve`, {
          wallet: wallet.address,
          budget: 2_000_000,
          signature
        })
        assert.strictEqual(replay.status, 409)
        assert.strictEqual(errorCode(replay.json), "setup_already_decided")

        const issued = yield* token({ grant_type: DEVICE_CODE_GRANT, device_code: started.device_code }, true)
        assert.strictEqual(issued.status, 200, issued.text)
        assert.strictEqual(issued.headers.get("cache-control"), "no-store")
        const key = issued.json as Record<string, unknown> & { access_token: string; key_id: string }
        assert.match(key.access_token, /^svc_ck_/)
        assert.deepInclude(key, {
          token_type: "credit_key",
          header: "x-credit-key",
          budget: 2_000_000,
          budget_usdc: "2.000000",
          wallet: wallet.address.toLowerCase(),
          label: "Codex CLI (agent setup)"
        })
        const again = yield* token({ device_code: started.device_code })
        assert.strictEqual(again.status, 400)
        assert.strictEqual((again.json as { error: string }).error, "invalid_grant")

        // A normal wallet key: listed with its expiry, readable with x-credit-key, revocable by the wallet.
        const listed = yield* signedCall(wallet, "GET", "/v1/keys")
        const entry = (listed.json as { data: Array<Record<string, unknown>> }).data.find(
          (k) => k.id === key.key_id
        )
        assert.deepInclude(entry, { kind: "credit", budget: 2_000_000, expires_at: key.key_expires_at })
        assert.strictEqual((yield* balanceWith(key.access_token)).status, 200)
        const revoked = yield* signedCall(wallet, "DELETE", `/v1/keys/${key.key_id}`)
        assert.strictEqual(revoked.status, 200, revoked.text)
        const after = yield* balanceWith(key.access_token)
        assert.strictEqual(after.status, 401)
        assert.strictEqual(errorCode(after.json), "invalid_credit_key")
      })
    )

    it.effect("bad requests: OpenAI errors on the setup surface, OAuth errors on the token endpoint", () =>
      Effect.gen(function* () {
        const cases = [
          [{ harness: "cursor", budget_usdc: "1" }, "invalid_request"],
          [{ harness: "aider", budget_usdc: "0" }, "invalid_budget"],
          [{ harness: "aider", budget_usdc: "1.0000001" }, "invalid_budget"],
          [{ harness: "aider", budget_usdc: "1", network: "eip155:1" }, "unsupported_network"],
          [{ harness: "aider", budget_usdc: "1", key_expires_in: 60 }, "invalid_key_expiry"]
        ] as const
        for (const [body, code] of cases) {
          const reply = yield* postJson("/v1/agent-setup/sessions", body)
          assert.strictEqual(reply.status, 400, reply.text)
          assert.strictEqual(errorCode(reply.json), code, JSON.stringify(body))
        }
        const unknown = yield* call("/v1/agent-setup/sessions/BCDF-GHJK")
        assert.strictEqual(unknown.status, 404)
        assert.strictEqual(errorCode(unknown.json), "setup_not_found")

        for (const [body, error] of [
          [{ grant_type: "password", device_code: "x" }, "unsupported_grant_type"],
          [{ grant_type: DEVICE_CODE_GRANT }, "invalid_request"],
          [{ device_code: "svc_dc_nope" }, "invalid_grant"]
        ] as const) {
          const reply = yield* token(body)
          assert.strictEqual(reply.status, 400)
          assert.deepInclude(reply.json as object, { error })
        }
      })
    )

    it.effect(
      "the command exits 1 with the router's reason: a bad budget at once, a denial at the next poll",
      () =>
        Effect.gen(function* () {
          const base = yield* RouterUrl
          const configDir = join(scratchDirForTest("svc-setup-"), "config")
          const args = ["--router", base, "--harness", "aider", "--config-dir", configDir]
          const bad = yield* runCli([...args, "--budget", "five", "--no-qr"])
          assert.strictEqual(yield* bad.exitCode, 1)
          assert.include(bad.stderr(), "svc-setup: budget_usdc must be a positive decimal string")

          const denied = yield* runCli([...args, "--budget", "1"])
          const userCode = yield* printedUserCode(denied)
          // Without --no-qr the approval link is also printed as a QR code (half blocks, no colour into a pipe).
          yield* waitFor(
            "the QR code",
            Effect.sync(() => (/^ {2}█▀▀▀▀▀█ /m.test(denied.stdout()) ? true : undefined))
          )
          assert.strictEqual((yield* postJson(`/v1/agent-setup/sessions/${userCode}/deny`, {})).status, 200)
          assert.strictEqual(yield* denied.exitCode, 1)
          assert.include(denied.stderr(), "svc-setup: The wallet holder denied this setup; no key was issued")
          assert.isFalse(existsSync(configDir), "nothing was written")
        })
    )

    it.effect("the approval page and its script are served without a build step; the API is documented", () =>
      Effect.gen(function* () {
        const page = yield* call("/setup?code=BCDF-GHJK")
        assert.strictEqual(page.status, 200)
        assert.match(page.headers.get("content-type") ?? "", /^text\/html/)
        assert.include(page.headers.get("content-security-policy"), "frame-ancestors 'none'")
        assert.strictEqual(page.headers.get("x-frame-options"), "DENY")
        assert.include(page.text, '<script src="/setup/approve.js"></script>')
        assert.notMatch(page.text, /https?:\/\//, "nothing loads from another origin")
        const script = yield* call("/setup/approve.js")
        assert.strictEqual(script.status, 200)
        assert.match(script.headers.get("content-type") ?? "", /^text\/javascript/)
        assert.include(script.text, "eth_signTypedData_v4")
        const openapi = (yield* call("/openapi.json")).json as { paths: Record<string, unknown> }
        for (const path of [
          "/v1/agent-setup/sessions",
          "/v1/agent-setup/sessions/{code}",
          "/v1/agent-setup/sessions/{code}/approve",
          "/v1/agent-setup/token"
        ]) {
          assert.property(openapi.paths, path)
        }
      })
    )
  })
})
