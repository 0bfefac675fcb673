import { Effect } from "effect"
import type { Hex } from "viem"
import type { LocalAccount } from "viem/accounts"
import { type ApprovalTerms, approvalTypedData } from "../../src/setup/Approval.ts"

/**
 * Signs an approval the way a browser wallet does for `eth_signTypedData_v4`: the JSON typed data the
 * router serves (EIP712Domain included, integers as strings) with `wallet` and the budget filled in.
 */
export const signTypedDataJson = (account: LocalAccount, json: string) =>
  Effect.promise(() => {
    const typed = JSON.parse(json) as {
      domain: Record<string, unknown>
      types: Record<string, Array<{ name: string; type: string }>>
      primaryType: string
      message: Record<string, unknown>
    }
    return account.signTypedData(typed as Parameters<LocalAccount["signTypedData"]>[0])
  })

/** The typed data of `terms`, as JSON a wallet receives, approving `budget` by `account`. */
export const approvalJson = (
  terms: ApprovalTerms,
  chainId: number,
  account: { readonly address: string },
  budget: number = terms.budget
) => {
  const typed = approvalTypedData(terms, chainId)
  return JSON.stringify({
    ...typed,
    message: { ...typed.message, wallet: account.address, budget: String(budget) }
  })
}

/** Signs an approval of `terms` (optionally other terms than the ones posted, for tamper tests). */
export const signApproval = (
  account: LocalAccount,
  terms: ApprovalTerms,
  chainId: number,
  budget: number = terms.budget
): Effect.Effect<Hex> => signTypedDataJson(account, approvalJson(terms, chainId, account, budget))
