/**
 * A number per provider id for the whole process: 0, 1, 2, … in the order ids are first seen, never
 * reused (the ids are registered providers, so the table stays small). The quote book hands it with each
 * live quote (`LiveQuote.provider`) and the latency statistics keep their entries by it, so an auction
 * finds a provider's bid slot and its latency by array index instead of a map lookup by id (D301, D304).
 */
const numbers = new Map<string, number>()

/** The provider's number, given on first sight. */
export const providerNumber = (providerId: string): number => {
  let number = numbers.get(providerId)
  if (number === undefined) {
    number = numbers.size
    numbers.set(providerId, number)
  }
  return number
}

/** The provider's number, or undefined for an id never numbered. */
export const knownProviderNumber = (providerId: string): number | undefined => numbers.get(providerId)
