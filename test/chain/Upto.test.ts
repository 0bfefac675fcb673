import { assert, layer } from "@effect/vitest"
import type { PaymentPayload, PaymentRequirements } from "@x402/core/types"
import { toFacilitatorEvmSigner } from "@x402/evm"
import { createPermit2ApprovalTx, UptoEvmScheme } from "@x402/evm/upto/client"
import { UptoEvmScheme as UptoEvmFacilitator } from "@x402/evm/upto/facilitator"
import { ConfigProvider, Effect, Layer, Schema } from "effect"
import {
  type Address,
  BaseError,
  ContractFunctionRevertedError,
  createWalletClient,
  domainSeparator,
  erc20Abi,
  type Hex,
  http,
  keccak256,
  maxUint256,
  parseSignature,
  publicActions,
  toHex,
  type VerifyTypedDataParameters
} from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { testUsdcAbi, uptoProxyAbi } from "../../src/chain/artifacts.ts"
import { Chain } from "../../src/chain/Chain.ts"
import { devAccount } from "../../src/chain/DevAccounts.ts"
import {
  ensureUptoContracts,
  PERMIT2_ADDRESS,
  permit2RuntimeCode,
  UPTO_PROXY_ADDRESS
} from "../../src/chain/Permit2.ts"
import { permit2Abi } from "../../src/chain/permit2Artifact.ts"
import {
  readPermit2Allowance,
  readPermit2NonceUsed,
  recoverUptoPermitSigner,
  type UptoPermit,
  uptoSettleCall,
  verifyUptoPermitSignature
} from "../../src/chain/UptoPermit.ts"

// An empty provider: RPC_URL is unset whatever the environment says, so the layer starts its own Anvil.
const ChainEmbedded = Chain.layer.pipe(Layer.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord({}))))

const routerAccount = privateKeyToAccount(toHex(devAccount(0).getHdKey().privateKey!))

const HexString = Schema.TemplateLiteral(["0x", Schema.String])
/** The payload the official upto client sends (`payload` of the PaymentPayload), as it appears on the wire. */
const UptoWirePayload = Schema.Struct({
  signature: HexString,
  permit2Authorization: Schema.Struct({
    from: HexString,
    permitted: Schema.Struct({ token: HexString, amount: Schema.String }),
    spender: HexString,
    nonce: Schema.String,
    deadline: Schema.String,
    witness: Schema.Struct({ to: HexString, facilitator: HexString, validAfter: Schema.String })
  })
})

const toPermit = (wire: typeof UptoWirePayload.Type): UptoPermit => {
  const a = wire.permit2Authorization
  return {
    from: a.from,
    permitted: { token: a.permitted.token, amount: BigInt(a.permitted.amount) },
    spender: a.spender,
    nonce: BigInt(a.nonce),
    deadline: BigInt(a.deadline),
    witness: {
      to: a.witness.to,
      facilitator: a.witness.facilitator,
      validAfter: BigInt(a.witness.validAfter)
    },
    signature: wire.signature
  }
}

const walletClient = (chain: typeof Chain.Service, key: Hex) =>
  createWalletClient({
    account: privateKeyToAccount(key),
    chain: chain.publicClient.chain,
    transport: http(chain.rpcUrl)
  }).extend(publicActions)

/** The name of the custom error a call reverted with, or its reason string. */
const revertOf = (attempt: Promise<unknown>) =>
  Effect.promise(() =>
    attempt.then(
      () => "no revert",
      (error: unknown) => {
        const reverted =
          error instanceof BaseError ? error.walk((e) => e instanceof ContractFunctionRevertedError) : null
        return reverted instanceof ContractFunctionRevertedError
          ? (reverted.reason ?? reverted.data?.errorName ?? "unknown revert")
          : `not a revert: ${String(error)}`
      }
    )
  )

const requirementsFor = (chain: typeof Chain.Service, ceiling: bigint): PaymentRequirements => ({
  scheme: "upto",
  network: chain.network,
  amount: ceiling.toString(),
  asset: chain.token,
  payTo: chain.treasury,
  maxTimeoutSeconds: 3600,
  extra: { ...chain.tokenDomain, facilitatorAddress: chain.routerSigner }
})

/** Demo wallet `walletIndex` approves Permit2 once, with the helper the official package exports. */
const approvePermit2 = Effect.fn(function* (walletIndex: number) {
  const chain = yield* Chain
  const payer = walletClient(chain, chain.demoWallets[walletIndex]!.privateKey!)
  const tx = createPermit2ApprovalTx(chain.token)
  const hash = yield* Effect.promise(() => payer.sendTransaction(tx))
  yield* Effect.promise(() => payer.waitForTransactionReceipt({ hash }))
})

/** The official upto client signs a payment of at most `ceiling` from demo wallet `walletIndex`. */
const officialUptoPayment = Effect.fn(function* (walletIndex: number, ceiling: bigint) {
  const chain = yield* Chain
  const account = privateKeyToAccount(chain.demoWallets[walletIndex]!.privateKey!)
  const requirements = requirementsFor(chain, ceiling)
  const created = yield* Effect.promise(() =>
    new UptoEvmScheme(account).createPaymentPayload(2, requirements)
  )
  const wire = yield* Schema.decodeUnknownEffect(UptoWirePayload)(created.payload)
  const payload: PaymentPayload = { x402Version: 2, accepted: requirements, payload: created.payload }
  return { requirements, payload, permit: toPermit(wire), payer: account.address }
})

const routerSettles = (permit: UptoPermit, amount: bigint) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    const router = walletClient(chain, toHex(devAccount(0).getHdKey().privateKey!))
    const hash = yield* Effect.promise(() => router.writeContract(uptoSettleCall(permit, amount)))
    return yield* Effect.promise(() => router.waitForTransactionReceipt({ hash }))
  })

const simulateSettle = (chain: typeof Chain.Service, permit: UptoPermit, amount: bigint, caller: Address) =>
  revertOf(chain.publicClient.simulateContract({ ...uptoSettleCall(permit, amount), account: caller }))

layer(ChainEmbedded, { timeout: "120 seconds" })("upto contracts on the embedded Anvil", (it) => {
  it.effect("Permit2 and the proxy sit at their canonical addresses with the canonical domain", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      assert.strictEqual(chain.permit2, PERMIT2_ADDRESS)
      assert.strictEqual(chain.uptoProxy, UPTO_PROXY_ADDRESS)
      const read = chain.publicClient
      assert.strictEqual(
        yield* Effect.promise(() =>
          read.readContract({ address: PERMIT2_ADDRESS, abi: permit2Abi, functionName: "DOMAIN_SEPARATOR" })
        ),
        domainSeparator({
          domain: {
            name: "Permit2",
            chainId: 31337,
            verifyingContract: "0x000000000022D473030F116dDEE9F6B43aC78BA3"
          }
        })
      )
      assert.strictEqual(
        yield* Effect.promise(() => read.getCode({ address: PERMIT2_ADDRESS })),
        permit2RuntimeCode(31337)
      )
      const proxy = <F extends "PERMIT2" | "WITNESS_TYPEHASH" | "WITNESS_TYPE_STRING">(functionName: F) =>
        Effect.promise(() =>
          read.readContract({ address: UPTO_PROXY_ADDRESS, abi: uptoProxyAbi, functionName })
        )
      assert.strictEqual(yield* proxy("PERMIT2"), PERMIT2_ADDRESS)
      assert.strictEqual(
        yield* proxy("WITNESS_TYPEHASH"),
        keccak256(toHex("Witness(address to,address facilitator,uint256 validAfter)"))
      )
      assert.strictEqual(
        yield* proxy("WITNESS_TYPE_STRING"),
        "Witness witness)TokenPermissions(address token,uint256 amount)Witness(address to,address facilitator,uint256 validAfter)"
      )
    })
  )

  it.effect("placing them again is a no-op (a restarted chain that kept its state)", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const before = yield* Effect.promise(() => chain.publicClient.getCode({ address: UPTO_PROXY_ADDRESS }))
      const again = yield* ensureUptoContracts({
        rpcUrl: chain.rpcUrl,
        chainId: chain.chainId,
        publicClient: chain.publicClient
      })
      assert.deepStrictEqual(again.placed, [])
      assert.strictEqual(
        yield* Effect.promise(() => chain.publicClient.getCode({ address: UPTO_PROXY_ADDRESS })),
        before
      )
    })
  )

  it.effect("settles exactly the actual amount of a permit signed by the official upto client, once", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      assert.strictEqual(
        yield* readPermit2Allowance(chain.publicClient, chain.token, chain.demoWallets[0]!.address),
        0n
      )
      yield* approvePermit2(0)
      const { permit, payer } = yield* officialUptoPayment(0, 5_000_000n)
      assert.strictEqual(yield* readPermit2Allowance(chain.publicClient, chain.token, payer), maxUint256)

      // what the official client signed
      assert.strictEqual(permit.from, payer)
      assert.deepStrictEqual(permit.permitted, { token: chain.token, amount: 5_000_000n })
      assert.strictEqual(permit.spender, UPTO_PROXY_ADDRESS)
      assert.deepStrictEqual(permit.witness, {
        to: chain.treasury,
        facilitator: chain.routerSigner,
        validAfter: 0n
      })
      // the helpers the verifier will use
      assert.isTrue(yield* verifyUptoPermitSignature(chain.chainId, permit))
      assert.strictEqual(yield* recoverUptoPermitSigner(chain.chainId, permit), payer)
      assert.isFalse(yield* verifyUptoPermitSignature(chain.chainId, { ...permit, nonce: permit.nonce + 1n }))
      assert.isFalse(
        yield* verifyUptoPermitSignature(chain.chainId, {
          ...permit,
          witness: { ...permit.witness, to: chain.routerSigner }
        })
      )
      assert.isFalse(yield* verifyUptoPermitSignature(chain.chainId, { ...permit, signature: "0x1234" }))
      assert.isFalse(yield* readPermit2NonceUsed(chain.publicClient, payer, permit.nonce))

      const payerBefore = yield* chain.balanceOf(payer)
      const treasuryBefore = yield* chain.balanceOf(chain.treasury)
      const receipt = yield* routerSettles(permit, 1_234_567n)
      assert.strictEqual(receipt.status, "success")
      assert.strictEqual(yield* chain.balanceOf(payer), payerBefore - 1_234_567n)
      assert.strictEqual(yield* chain.balanceOf(chain.treasury), treasuryBefore + 1_234_567n)
      const logs = yield* chain.readTransferLogs({
        fromBlock: receipt.blockNumber,
        toBlock: receipt.blockNumber
      })
      assert.deepStrictEqual(
        logs.map(({ from, to, value }) => ({ from, to, value })),
        [{ from: payer, to: chain.treasury, value: 1_234_567n }]
      )
      assert.isTrue(yield* readPermit2NonceUsed(chain.publicClient, payer, permit.nonce))
      // the other bits of the nonce's word stay free
      assert.isFalse(yield* readPermit2NonceUsed(chain.publicClient, payer, permit.nonce ^ 1n))

      // the remaining headroom of the ceiling cannot be claimed by a second settlement
      assert.strictEqual(yield* simulateSettle(chain, permit, 1n, chain.routerSigner), "InvalidNonce")
      assert.strictEqual(yield* chain.balanceOf(payer), payerBefore - 1_234_567n)
    })
  )

  it.effect(
    "refuses a settlement above the ceiling, by anyone but the facilitator, or to another payee",
    () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        yield* approvePermit2(1)
        const { permit, payer } = yield* officialUptoPayment(1, 2_000_000n)
        const payerBefore = yield* chain.balanceOf(payer)

        assert.strictEqual(
          yield* simulateSettle(chain, permit, 2_000_001n, chain.routerSigner),
          "AmountExceedsPermitted"
        )
        assert.strictEqual(
          yield* simulateSettle(chain, permit, 1_000n, chain.treasury),
          "UnauthorizedFacilitator"
        )
        assert.strictEqual(yield* simulateSettle(chain, permit, 1_000n, payer), "UnauthorizedFacilitator")
        // a facilitator named in a forged witness is refused by Permit2: the witness is part of what was signed
        const forged = { ...permit, witness: { ...permit.witness, facilitator: chain.treasury } }
        assert.strictEqual(yield* simulateSettle(chain, forged, 1_000n, chain.treasury), "InvalidSigner")
        const redirected = { ...permit, witness: { ...permit.witness, to: chain.routerSigner } }
        assert.strictEqual(
          yield* simulateSettle(chain, redirected, 1_000n, chain.routerSigner),
          "InvalidSigner"
        )
        // a sent transaction reverts the same way and moves nothing
        const router = walletClient(chain, toHex(devAccount(0).getHdKey().privateKey!))
        const hash = yield* Effect.promise(() =>
          router.writeContract({ ...uptoSettleCall(permit, 2_000_001n), gas: 300_000n })
        )
        const receipt = yield* Effect.promise(() => router.waitForTransactionReceipt({ hash }))
        assert.strictEqual(receipt.status, "reverted")
        assert.strictEqual(yield* chain.balanceOf(payer), payerBefore)
        assert.isFalse(yield* readPermit2NonceUsed(chain.publicClient, payer, permit.nonce))

        // the full ceiling is settleable
        assert.strictEqual((yield* routerSettles(permit, 2_000_000n)).status, "success")
        assert.strictEqual(yield* chain.balanceOf(payer), payerBefore - 2_000_000n)
      })
  )

  it.effect("a payer without Permit2 approval cannot be settled until it approves", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const { permit, payer } = yield* officialUptoPayment(2, 1_000_000n)
      assert.strictEqual(yield* readPermit2Allowance(chain.publicClient, chain.token, payer), 0n)
      assert.strictEqual(
        yield* simulateSettle(chain, permit, 500_000n, chain.routerSigner),
        "TRANSFER_FROM_FAILED"
      )
      yield* approvePermit2(2)
      assert.strictEqual(yield* simulateSettle(chain, permit, 500_000n, chain.routerSigner), "no revert")
    })
  )

  it.effect("settleWithPermit approves Permit2 with the payer's EIP-2612 permit in the same call", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const { permit, payer } = yield* officialUptoPayment(3, 3_000_000n)
      const payerAccount = privateKeyToAccount(chain.demoWallets[3]!.privateKey!)
      const nonce = yield* Effect.promise(() =>
        chain.publicClient.readContract({
          address: chain.token,
          abi: testUsdcAbi,
          functionName: "nonces",
          args: [payer]
        })
      )
      const signed = yield* Effect.promise(() =>
        payerAccount.signTypedData({
          domain: { ...chain.tokenDomain, chainId: chain.chainId, verifyingContract: chain.token },
          types: {
            Permit: [
              { name: "owner", type: "address" },
              { name: "spender", type: "address" },
              { name: "value", type: "uint256" },
              { name: "nonce", type: "uint256" },
              { name: "deadline", type: "uint256" }
            ]
          },
          primaryType: "Permit",
          message: {
            owner: payer,
            spender: PERMIT2_ADDRESS,
            value: 3_000_000n,
            nonce,
            deadline: permit.deadline
          }
        })
      )
      const { r, s, yParity } = parseSignature(signed)
      const permit2612 = { value: 3_000_000n, deadline: permit.deadline, r, s, v: 27 + yParity }
      const settleArgs = uptoSettleCall(permit, 700_000n).args
      const router = walletClient(chain, toHex(devAccount(0).getHdKey().privateKey!))
      const payerBefore = yield* chain.balanceOf(payer)

      const mismatch = revertOf(
        chain.publicClient.simulateContract({
          address: UPTO_PROXY_ADDRESS,
          abi: uptoProxyAbi,
          functionName: "settleWithPermit",
          args: [{ ...permit2612, value: 2_999_999n }, ...settleArgs],
          account: chain.routerSigner
        })
      )
      assert.strictEqual(yield* mismatch, "Permit2612AmountMismatch")

      const hash = yield* Effect.promise(() =>
        router.writeContract({
          address: UPTO_PROXY_ADDRESS,
          abi: uptoProxyAbi,
          functionName: "settleWithPermit",
          args: [permit2612, ...settleArgs]
        })
      )
      assert.strictEqual(
        (yield* Effect.promise(() => router.waitForTransactionReceipt({ hash }))).status,
        "success"
      )
      assert.strictEqual(yield* chain.balanceOf(payer), payerBefore - 700_000n)
      assert.strictEqual(
        yield* Effect.promise(() =>
          chain.publicClient.readContract({
            address: chain.token,
            abi: erc20Abi,
            functionName: "allowance",
            args: [payer, PERMIT2_ADDRESS]
          })
        ),
        3_000_000n - 700_000n
      )
    })
  )

  it.effect("the official x402 upto facilitator verifies and settles through these contracts", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      yield* approvePermit2(4)
      const { payload, requirements, payer } = yield* officialUptoPayment(4, 4_000_000n)
      const client = walletClient(chain, toHex(devAccount(0).getHdKey().privateKey!))
      // The package's signer interface is looser than viem's generics: the calls are passed straight through.
      const signer = toFacilitatorEvmSigner({
        ...client,
        address: routerAccount.address,
        verifyTypedData: (args) => client.verifyTypedData(args as VerifyTypedDataParameters)
      })
      const facilitator = new UptoEvmFacilitator(signer)
      assert.deepStrictEqual(facilitator.getExtra(chain.network), { facilitatorAddress: chain.routerSigner })
      const verified = yield* Effect.promise(() => facilitator.verify(payload, requirements))
      assert.deepStrictEqual(verified, { isValid: true, invalidReason: undefined, payer })

      const payerBefore = yield* chain.balanceOf(payer)
      const settled = yield* Effect.promise(() =>
        facilitator.settle(payload, { ...requirements, amount: "654321" })
      )
      assert.isTrue(settled.success, settled.errorReason)
      assert.strictEqual(settled.amount, "654321")
      assert.strictEqual(yield* chain.balanceOf(payer), payerBefore - 654_321n)
    })
  )
})
