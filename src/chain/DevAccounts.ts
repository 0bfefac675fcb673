import { type Hex, toHex } from "viem"
import { type HDAccount, mnemonicToAccount } from "viem/accounts"

/** Anvil's public test mnemonic. Every key derived from it is public knowledge: devnet use only. */
export const DEV_MNEMONIC = "test test test test test test test test test test test junk"

export const DEV_ACCOUNT_COUNT = 10

/** Index 0 signs and pays gas for router transactions; 1 receives payments; 2..9 are demo payers. */
export const ROUTER_SIGNER_INDEX = 0
export const TREASURY_INDEX = 1
export const DEMO_WALLET_INDICES = [2, 3, 4, 5, 6, 7, 8, 9] as const

let derived: ReadonlyArray<HDAccount> | undefined

/** All ten dev accounts, derived once (BIP-32 derivation costs tens of milliseconds per account). */
export const devAccounts = (): ReadonlyArray<HDAccount> => {
  derived ??= Array.from({ length: DEV_ACCOUNT_COUNT }, (_, addressIndex) =>
    mnemonicToAccount(DEV_MNEMONIC, { addressIndex })
  )
  return derived
}

export const devAccount = (index: number): HDAccount => {
  const account = devAccounts()[index]
  if (account === undefined)
    throw new RangeError(`dev account index ${index} is outside 0..${DEV_ACCOUNT_COUNT - 1}`)
  return account
}

export const routerSignerAccount = (): HDAccount => devAccount(ROUTER_SIGNER_INDEX)
export const treasuryAccount = (): HDAccount => devAccount(TREASURY_INDEX)
export const demoWalletAccounts = (): ReadonlyArray<HDAccount> => DEMO_WALLET_INDICES.map(devAccount)

/** A dev account's private key (public knowledge, like the mnemonic it is derived from). */
export const privateKeyOf = (account: HDAccount): Hex => {
  const key = account.getHdKey().privateKey
  if (key === null) throw new Error("a dev account derived without its private key")
  return toHex(key)
}
