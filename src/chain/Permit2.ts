import { Effect } from "effect"
import {
  type Address,
  concat,
  createTestClient,
  domainSeparator,
  type Hex,
  http,
  keccak256,
  numberToHex,
  type PublicClient,
  size,
  slice,
  toHex
} from "viem"
import { uptoProxyAbi, uptoProxyDeployedBytecode } from "./artifacts.ts"
import { ChainError, viemCall } from "./ChainError.ts"
import { permit2Abi, permit2Immutables, permit2RuntimeBytecode } from "./permit2Artifact.ts"

/** Uniswap's Permit2, at the same address on every chain (`PERMIT2_ADDRESS` of `@x402/evm`). */
export const PERMIT2_ADDRESS: Address = "0x000000000022D473030F116dDEE9F6B43aC78BA3"

/** The x402 upto proxy, at the same address on every chain (`x402UptoPermit2ProxyAddress` of `@x402/evm`). */
export const UPTO_PROXY_ADDRESS: Address = "0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002"

/** Permit2's EIP-712 domain: no version field. */
export const permit2Domain = (chainId: number) =>
  ({ name: "Permit2", chainId, verifyingContract: PERMIT2_ADDRESS }) as const

export const permit2DomainSeparator = (chainId: number): Hex =>
  domainSeparator({ domain: permit2Domain(chainId) })

/** The witness type the upto proxy hands Permit2, and its hash (the proxy's `WITNESS_TYPEHASH`). */
export const UPTO_WITNESS_TYPE = "Witness(address to,address facilitator,uint256 validAfter)"
export const UPTO_WITNESS_TYPEHASH: Hex = keccak256(toHex(UPTO_WITNESS_TYPE))

const writeAt = (code: Hex, ranges: ReadonlyArray<{ start: number; length: number }>, value: Hex): Hex =>
  ranges.reduce(
    (acc, { start, length }) =>
      concat([
        slice(acc, 0, start),
        numberToHex(BigInt(value), { size: length }),
        slice(acc, start + length)
      ]),
    code
  )

/**
 * Permit2's runtime code as its constructor would have left it at the canonical address on `chainId`: the
 * cached chain id and the cached domain separator (over the canonical address) written into its immutables.
 */
export const permit2RuntimeCode = (chainId: number): Hex => {
  const code = writeAt(permit2RuntimeBytecode, permit2Immutables._CACHED_CHAIN_ID, numberToHex(chainId))
  const filled = writeAt(code, permit2Immutables._CACHED_DOMAIN_SEPARATOR, permit2DomainSeparator(chainId))
  if (size(filled) !== size(permit2RuntimeBytecode)) throw new Error("Permit2 immutables out of range")
  return filled
}

export type UptoContractState = "absent" | "ok" | "unexpected"

export interface UptoContractsReport {
  readonly permit2: UptoContractState
  readonly uptoProxy: UptoContractState
}

// A contract that is there but answers wrongly (or reverts) is "unexpected", never "ok".
const answers = <A>(read: () => Promise<A>, expected: A) =>
  Effect.tryPromise(read).pipe(
    Effect.map((actual) => actual === expected),
    Effect.orElseSucceed(() => false)
  )

/**
 * What is at the two canonical addresses: `ok` when Permit2 reports the domain separator of the canonical
 * address on this chain and the proxy names that Permit2 and the upto witness type (any faithful deployment
 * passes, not only ours); `absent` without code.
 */
export const inspectUptoContracts = Effect.fn("Permit2.inspect")(function* (
  publicClient: PublicClient,
  chainId: number
) {
  const state = (address: Address, sane: Effect.Effect<boolean>) =>
    viemCall("Permit2.inspect", () => publicClient.getCode({ address })).pipe(
      Effect.flatMap((code) =>
        code === undefined || code === "0x"
          ? Effect.succeed<UptoContractState>("absent")
          : sane.pipe(Effect.map((good): UptoContractState => (good ? "ok" : "unexpected")))
      )
    )
  const read =
    <F extends "PERMIT2" | "WITNESS_TYPEHASH">(functionName: F) =>
    () =>
      publicClient.readContract({ address: UPTO_PROXY_ADDRESS, abi: uptoProxyAbi, functionName })
  return {
    permit2: yield* state(
      PERMIT2_ADDRESS,
      answers(
        () =>
          publicClient.readContract({
            address: PERMIT2_ADDRESS,
            abi: permit2Abi,
            functionName: "DOMAIN_SEPARATOR"
          }),
        permit2DomainSeparator(chainId)
      )
    ),
    uptoProxy: yield* state(
      UPTO_PROXY_ADDRESS,
      Effect.all([
        answers(read("PERMIT2"), PERMIT2_ADDRESS),
        answers(read("WITNESS_TYPEHASH"), UPTO_WITNESS_TYPEHASH)
      ]).pipe(Effect.map(([permit2, witness]) => permit2 && witness))
    )
  } satisfies UptoContractsReport
})

export interface UptoContracts {
  readonly permit2: Address
  readonly uptoProxy: Address
  /** What this call placed: empty when both were already there (a restarted persistent chain). */
  readonly placed: ReadonlyArray<"Permit2" | "x402UptoPermit2Proxy">
}

/**
 * Puts Permit2 and the upto proxy at their canonical addresses on a development chain (Anvil's
 * `anvil_setCode`, or Hardhat's `hardhat_setCode`) where they are missing; code already there is left alone.
 * Idempotent. Fails (`Devnet`) unless both then answer as they should (`inspectUptoContracts`).
 */
export const ensureUptoContracts = Effect.fn("Permit2.ensureUptoContracts")(function* (
  chain: { readonly rpcUrl: string; readonly chainId: number; readonly publicClient: PublicClient },
  mode: "anvil" | "hardhat" = "anvil"
) {
  const before = yield* inspectUptoContracts(chain.publicClient, chain.chainId)
  const testClient = createTestClient({ mode, transport: http(chain.rpcUrl) })
  const place = (address: Address, bytecode: Hex) =>
    viemCall("Permit2.ensureUptoContracts", () => testClient.setCode({ address, bytecode }))
  const placed: Array<UptoContracts["placed"][number]> = []
  if (before.permit2 === "absent") {
    yield* place(PERMIT2_ADDRESS, permit2RuntimeCode(chain.chainId))
    placed.push("Permit2")
  }
  if (before.uptoProxy === "absent") {
    yield* place(UPTO_PROXY_ADDRESS, uptoProxyDeployedBytecode)
    placed.push("x402UptoPermit2Proxy")
  }
  const after = placed.length === 0 ? before : yield* inspectUptoContracts(chain.publicClient, chain.chainId)
  if (after.permit2 !== "ok" || after.uptoProxy !== "ok") {
    return yield* new ChainError({
      reason: "Devnet",
      message: `upto contracts are not usable: Permit2 ${after.permit2}, upto proxy ${after.uptoProxy}`
    })
  }
  return { permit2: PERMIT2_ADDRESS, uptoProxy: UPTO_PROXY_ADDRESS, placed } satisfies UptoContracts
})
