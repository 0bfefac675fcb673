import { assert, describe, layer } from "@effect/vitest"
import { Effect, Layer, Result } from "effect"
import { SqlClient } from "effect/sql"
import { TestClock } from "effect/testing"
import { devAccount } from "../../src/chain/DevAccounts.ts"
import { DEVICE_CODE_GRANT, type DeviceFlowError } from "../../src/domain/Setup.ts"
import { Keys } from "../../src/payment/Keys.ts"
import { AgentSetups, type StartInput } from "../../src/setup/AgentSetups.ts"
import { SetupSettings } from "../../src/setup/SetupSettings.ts"
import { TestDatabase } from "../support/Database.ts"
import { signApproval } from "./support.ts"

const CHAIN_ID = 31337
const SetupLayer = AgentSetups.layer.pipe(
  Layer.provideMerge(Keys.layer),
  Layer.provideMerge(SetupSettings.test({ chainId: CHAIN_ID, intervalSeconds: 5, setupTtlSeconds: 600 })),
  Layer.provideMerge(TestDatabase)
)

const [alice, bob, carol] = [2, 3, 4].map(devAccount) as [
  ReturnType<typeof devAccount>,
  ReturnType<typeof devAccount>,
  ReturnType<typeof devAccount>
]

const ask: StartInput = { harness: "claude-code", budget: 5_000_000, keyExpiresIn: 7 * 24 * 3600 }

/** The RFC 8628 error a token request got, or "issued". */
const poll = (deviceCode: string) =>
  Effect.gen(function* () {
    const setups = yield* AgentSetups
    const result = yield* Effect.result(setups.exchange({ grantType: DEVICE_CODE_GRANT, deviceCode }))
    return Result.isSuccess(result) ? ("issued" as const) : (result.failure as DeviceFlowError).error
  })

const failureOf = <A, E extends { readonly _tag: string; readonly code?: string }>(
  effect: Effect.Effect<A, E>
) => Effect.map(Effect.flip(effect), (error) => `${error._tag}:${error.code ?? ""}`)

/** A started setup approved by `alice` (invited) for `budget`. */
const approved = (budget = ask.budget, input: StartInput = ask) =>
  Effect.gen(function* () {
    const setups = yield* AgentSetups
    const started = yield* setups.start(input)
    const signature = yield* signApproval(alice, started.setup, CHAIN_ID, budget)
    const view = yield* setups.approve(started.setup.userCode, { wallet: alice.address, budget, signature })
    return { started, view }
  })

describe("agent setup (device flow, RFC 8628) on the router clock", () => {
  // it.effect runs on the TestClock: the clock starts at 0 and moves only when told.
  layer(SetupLayer, { timeout: 60_000 })((it) => {
    it.effect("codes are stored only hashed; the view shows exactly the terms asked", () =>
      Effect.gen(function* () {
        const setups = yield* AgentSetups
        const keys = yield* Keys
        yield* keys.setInvited(alice.address, true)
        const started = yield* setups.start({ ...ask, label: "laptop" })
        assert.match(started.setup.userCode, /^[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}$/)
        assert.match(started.deviceCode, /^svc_dc_[A-Za-z0-9_-]{43}$/)
        assert.strictEqual(started.intervalSeconds, 5)
        assert.strictEqual(started.expiresIn, 600)
        const view = yield* setups.view(started.setup.userCode.toLowerCase().replace("-", " "))
        assert.deepInclude(view, {
          status: "pending",
          harness: "claude-code",
          network: "eip155:31337",
          budget: 5_000_000,
          keyExpiresAt: 7 * 24 * 3600,
          expiresAt: 600,
          label: "laptop",
          wallet: null
        })
        const sql = yield* SqlClient.SqlClient
        const [row] = yield* sql<{ stored: string }>`
          SELECT row_to_json(a)::text AS stored FROM agent_setups a WHERE setup_id = ${view.setupId}
        `
        const stored = row!.stored
        assert.include(stored, view.setupId)
        assert.notInclude(stored, started.deviceCode)
        assert.notInclude(stored, started.setup.userCode)
        assert.notInclude(stored, started.setup.userCode.replace("-", ""))
        assert.strictEqual(yield* failureOf(setups.view("AAAA-AAAA")), "InvalidRequest:invalid_user_code")
        assert.strictEqual(yield* failureOf(setups.view("BBBB-BBBB")), "NotFound:setup_not_found")
      })
    )

    it.effect(
      "pending, slow_down (interval +5 s, kept), pending at the new interval, then the key once",
      () =>
        Effect.gen(function* () {
          const setups = yield* AgentSetups
          yield* (yield* Keys).setInvited(alice.address, true)
          yield* TestClock.setTime(1_000_000)
          const started = yield* setups.start(ask)
          const code = started.deviceCode
          assert.strictEqual(yield* poll(code), "authorization_pending")
          yield* TestClock.adjust("5 seconds")
          assert.strictEqual(yield* poll(code), "authorization_pending")
          yield* TestClock.adjust("1 second")
          assert.strictEqual(yield* poll(code), "slow_down", "1 s after a poll, at a 5 s interval")
          // The interval is now 10 s: a client still polling every 5 s is told again.
          yield* TestClock.adjust("5 seconds")
          assert.strictEqual(yield* poll(code), "slow_down")
          // A 20% allowance for request latency: 12 s at a 15 s interval is polite.
          yield* TestClock.adjust("12 seconds")
          assert.strictEqual(yield* poll(code), "authorization_pending")

          const signature = yield* signApproval(alice, started.setup, CHAIN_ID)
          yield* setups.approve(started.setup.userCode, {
            wallet: alice.address,
            budget: ask.budget,
            signature
          })
          // Approved: the key comes at once, however soon after the last poll.
          const issued = yield* setups.exchange({ grantType: DEVICE_CODE_GRANT, deviceCode: code })
          assert.match(issued.secret, /^svc_ck_/)
          assert.strictEqual(issued.wallet, alice.address.toLowerCase())
          assert.strictEqual(issued.budget, ask.budget)
          assert.strictEqual(issued.keyExpiresAt, 1_000 + 7 * 24 * 3600)
          assert.strictEqual(issued.expiresIn, 7 * 24 * 3600 - 23)
          assert.strictEqual(yield* poll(code), "invalid_grant", "a device code is exchanged once")
          assert.strictEqual((yield* setups.view(started.setup.userCode)).status, "exchanged")

          // The key is a normal credit key of the approving wallet: listed, spendable, expiring on time.
          const keys = yield* Keys
          const [listed] = (yield* keys.list(alice.address)).filter((k) => k.keyId === issued.keyId)
          assert.deepInclude(listed, {
            kind: "credit",
            budget: ask.budget,
            label: "Claude Code (agent setup)",
            expiresAt: issued.keyExpiresAt
          })
          assert.strictEqual((yield* keys.resolveCreditKey(issued.secret)).keyId, issued.keyId)
          yield* TestClock.setTime(issued.keyExpiresAt * 1000 - 1)
          assert.strictEqual((yield* keys.resolveCreditKey(issued.secret)).keyId, issued.keyId)
          yield* TestClock.adjust("1 millis")
          assert.strictEqual(
            yield* failureOf(keys.resolveCreditKey(issued.secret)),
            "Unauthorized:credit_key_expired"
          )
          assert.strictEqual(yield* failureOf(keys.resolveApiKey(issued.secret)), "Unauthorized:key_expired")
        })
    )

    it.effect("the approver may lower the budget (the key is capped there), never raise it", () =>
      Effect.gen(function* () {
        const setups = yield* AgentSetups
        yield* (yield* Keys).setInvited(alice.address, true)
        const { started, view } = yield* approved(1_250_000)
        assert.strictEqual(view.status, "approved")
        assert.strictEqual(view.approvedBudget, 1_250_000)
        assert.strictEqual(view.approvedBy, alice.address.toLowerCase())
        const issued = yield* setups.exchange({ deviceCode: started.deviceCode })
        assert.strictEqual(issued.budget, 1_250_000)

        const raised = yield* setups.start(ask)
        const signature = yield* signApproval(alice, raised.setup, CHAIN_ID, ask.budget + 1)
        assert.strictEqual(
          yield* failureOf(
            setups.approve(raised.setup.userCode, {
              wallet: alice.address,
              budget: ask.budget + 1,
              signature
            })
          ),
          "InvalidRequest:budget_above_request"
        )
        assert.strictEqual((yield* setups.view(raised.setup.userCode)).status, "pending")
      })
    )

    it.effect("tampered, replayed, another wallet's, non-invited and unbidden approvals are refused", () =>
      Effect.gen(function* () {
        const setups = yield* AgentSetups
        const keys = yield* Keys
        yield* keys.setInvited(alice.address, true)
        yield* keys.setInvited(bob.address, true)
        const started = yield* setups.start(ask)
        const code = started.setup.userCode
        const terms = started.setup
        const approveWith = (wallet: string, budget: number, signature: `0x${string}`, userCode = code) =>
          failureOf(setups.approve(userCode, { wallet, budget, signature }))

        // Terms changed after signing: the budget, the harness, the network, the key's expiry, the code.
        const signedAt = (changed: Partial<typeof terms>) =>
          signApproval(alice, { ...terms, ...changed }, CHAIN_ID)
        const lowered = yield* signApproval(alice, terms, CHAIN_ID, 1_000_000)
        assert.strictEqual(
          yield* approveWith(alice.address, 2_000_000, lowered),
          "Unauthorized:invalid_approval_signature"
        )
        for (const changed of [
          { harness: "codex" as const },
          { network: "eip155:1" },
          { keyExpiresAt: terms.keyExpiresAt + 1 },
          { userCode: "BBBB-BBBB" }
        ]) {
          const signature = yield* signedAt(changed)
          assert.strictEqual(
            yield* approveWith(alice.address, ask.budget, signature),
            "Unauthorized:invalid_approval_signature",
            JSON.stringify(changed)
          )
        }
        const otherChain = yield* signApproval(alice, terms, 1)
        assert.strictEqual(
          yield* approveWith(alice.address, ask.budget, otherChain),
          "Unauthorized:invalid_approval_signature"
        )
        // Another wallet's signature, claimed as alice's.
        const bobs = yield* signApproval(bob, terms, CHAIN_ID)
        assert.strictEqual(
          yield* approveWith(alice.address, ask.budget, bobs),
          "Unauthorized:invalid_approval_signature"
        )
        // A valid signature by a wallet nobody invited.
        const carols = yield* signApproval(carol, terms, CHAIN_ID)
        assert.strictEqual(
          yield* approveWith(carol.address, ask.budget, carols),
          "Forbidden:wallet_not_invited"
        )
        assert.strictEqual((yield* setups.view(code)).status, "pending", "no refusal decided anything")

        // A setup that names its approver refuses every other wallet, invited or not.
        const bound = yield* setups.start({ ...ask, wallet: alice.address })
        const bobsForBound = yield* signApproval(bob, bound.setup, CHAIN_ID)
        assert.strictEqual(
          yield* approveWith(bob.address, ask.budget, bobsForBound, bound.setup.userCode),
          "Forbidden:wrong_wallet"
        )

        // The right signature approves once; the same approval again is a 409, and it opens no other setup.
        const good = yield* signApproval(alice, terms, CHAIN_ID)
        const view = yield* setups.approve(code, {
          wallet: alice.address,
          budget: ask.budget,
          signature: good
        })
        assert.strictEqual(view.status, "approved")
        assert.strictEqual(
          yield* approveWith(alice.address, ask.budget, good),
          "Conflict:setup_already_decided"
        )
        const other = yield* setups.start(ask)
        assert.strictEqual(
          yield* approveWith(alice.address, ask.budget, good, other.setup.userCode),
          "Unauthorized:invalid_approval_signature"
        )
      })
    )

    it.effect("denied → access_denied; expired → expired_token; bad requests by their RFC names", () =>
      Effect.gen(function* () {
        const setups = yield* AgentSetups
        yield* (yield* Keys).setInvited(alice.address, true)
        yield* TestClock.setTime(50_000_000)
        const denied = yield* setups.start(ask)
        assert.strictEqual((yield* setups.deny(denied.setup.userCode)).status, "denied")
        assert.strictEqual(yield* poll(denied.deviceCode), "access_denied")
        assert.strictEqual(
          yield* failureOf(setups.deny(denied.setup.userCode)),
          "Conflict:setup_already_decided"
        )

        const late = yield* setups.start(ask)
        const lateApproved = yield* approved()
        yield* TestClock.adjust("599 seconds")
        assert.strictEqual(yield* poll(late.deviceCode), "authorization_pending")
        yield* TestClock.adjust("1 second")
        assert.strictEqual(yield* poll(late.deviceCode), "expired_token")
        assert.strictEqual((yield* setups.view(late.setup.userCode)).status, "expired")
        const signature = yield* signApproval(alice, late.setup, CHAIN_ID)
        assert.strictEqual(
          yield* failureOf(
            setups.approve(late.setup.userCode, { wallet: alice.address, budget: ask.budget, signature })
          ),
          "InvalidRequest:setup_expired"
        )
        // Approved but not collected in time: the approval lapses with the setup.
        assert.strictEqual(yield* poll(lateApproved.started.deviceCode), "expired_token")

        assert.strictEqual(yield* poll("svc_dc_unknown"), "invalid_grant")
        const wrongGrant = yield* Effect.flip(
          setups.exchange({ grantType: "authorization_code", deviceCode: late.deviceCode })
        )
        assert.strictEqual(wrongGrant.error, "unsupported_grant_type")
        assert.strictEqual((yield* Effect.flip(setups.exchange({}))).error, "invalid_request")
      })
    )

    it.effect("two concurrent exchanges of one approved code: exactly one gets the key", () =>
      Effect.gen(function* () {
        yield* (yield* Keys).setInvited(alice.address, true)
        for (let round = 0; round < 5; round++) {
          const { started } = yield* approved()
          const outcomes = yield* Effect.all([poll(started.deviceCode), poll(started.deviceCode)], {
            concurrency: "unbounded"
          })
          assert.sameMembers(outcomes, ["issued", "invalid_grant"])
        }
        const sql = yield* SqlClient.SqlClient
        const [keys] = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM api_keys WHERE key_id IN (SELECT key_id FROM agent_setups)
        `
        const [exchanged] = yield* sql<{
          n: number
        }>`SELECT count(*)::int AS n FROM agent_setups WHERE status = 'exchanged'`
        assert.strictEqual(keys!.n, exchanged!.n)
      })
    )

    it.effect("a wallet whose invite was withdrawn after approving gets no key: access_denied", () =>
      Effect.gen(function* () {
        const keys = yield* Keys
        yield* keys.setInvited(bob.address, true)
        const setups = yield* AgentSetups
        const started = yield* setups.start(ask)
        const signature = yield* signApproval(bob, started.setup, CHAIN_ID)
        yield* setups.approve(started.setup.userCode, { wallet: bob.address, budget: ask.budget, signature })
        yield* keys.setInvited(bob.address, false)
        assert.strictEqual(yield* poll(started.deviceCode), "access_denied")
        assert.strictEqual((yield* keys.list(bob.address)).length, 0)
      })
    )
  })
})
