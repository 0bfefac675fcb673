import { createHash, randomBytes, randomInt } from "node:crypto"

/** RFC 8628 section 3.5: a client told `slow_down` adds this many seconds to its interval, for good. */
export const SLOW_DOWN_STEP_S = 5

/**
 * Polling faster than the interval is `slow_down`. A gap of at least this share of the interval counts as
 * polite: a client that sleeps exactly the interval is seen a little early when its previous request was slow.
 */
export const POLITE_SHARE = 0.8

// RFC 8628 section 6.1: 20 consonants (no vowels, so no words; no digits to confuse with letters),
// 8 characters: 20^8 ≈ 2.6 × 10^10 codes, shown as two groups of four.
const USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"
const USER_CODE_LENGTH = 8

export const newUserCode = (): string => {
  const letters = Array.from({ length: USER_CODE_LENGTH }, () => USER_CODE_ALPHABET[randomInt(20)]).join("")
  return `${letters.slice(0, 4)}-${letters.slice(4)}`
}

/**
 * A user code as typed by a person (any case, dashes or spaces anywhere) to its canonical `XXXX-XXXX`;
 * undefined when it cannot be one.
 */
export const normalizeUserCode = (text: string): string | undefined => {
  const letters = text.toUpperCase().replace(/[\s-]/g, "")
  if (letters.length !== USER_CODE_LENGTH) return undefined
  for (const letter of letters) if (!USER_CODE_ALPHABET.includes(letter)) return undefined
  return `${letters.slice(0, 4)}-${letters.slice(4)}`
}

/** The device code: a bearer secret for polling, 256 random bits. */
export const newDeviceCode = () => `svc_dc_${randomBytes(32).toString("base64url")}`

/** Codes are stored only as SHA-256 (of the canonical form, for user codes). */
export const hashCode = (code: string) => createHash("sha256").update(code, "utf8").digest("hex")
