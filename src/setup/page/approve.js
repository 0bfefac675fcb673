// The agent-setup approval page (spec 4.5). It never sees a key: it reads the setup's terms, asks the
// injected EIP-1193 wallet for an EIP-712 signature over exactly those terms (with the budget the holder
// chose, never above the one asked), posts the approval and shows the result. The key goes to the terminal
// that polls the token endpoint.
;(() => {
  const byId = (id) => document.getElementById(id)
  const DECIMALS = 6n
  const UNIT = 10n ** DECIMALS

  const parseUsdc = (text) => {
    const match = /^(\d{1,9})(?:\.(\d{1,6}))?$/.exec(text.trim())
    if (match === null) return undefined
    return BigInt(match[1]) * UNIT + BigInt((match[2] ?? "").padEnd(Number(DECIMALS), "0"))
  }
  const when = (unixSeconds) => {
    const date = new Date(unixSeconds * 1000)
    return `${date.toLocaleString()} (${date.toISOString().replace(".000Z", "Z")})`
  }

  const show = (kind, text) => {
    const box = byId("result")
    box.hidden = false
    box.className = kind
    box.textContent = text
  }
  const settle = (text, kind = "ok") => {
    byId("actions").hidden = true
    byId("budget").disabled = true
    show(kind, text)
  }

  const errorText = (body, status) =>
    body?.error?.message ?? (typeof body?.error === "string" ? body.error : `The router answered ${status}`)

  const request = async (method, path, body) => {
    const response = await fetch(path, {
      method,
      headers: body === undefined ? {} : { "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body)
    })
    const json = await response.json().catch(() => undefined)
    return { ok: response.ok, status: response.status, json }
  }

  const statusText = {
    approved: "Approved. Your terminal receives its key within a few seconds; you can close this page.",
    exchanged: "This setup is finished: its key was delivered to the terminal that asked.",
    denied: "Denied. The terminal that asked gets no key.",
    expired: "This code has expired. Run the setup command again for a new code."
  }

  const render = (setup) => {
    byId("terms").hidden = false
    byId("summary").textContent =
      `A coding agent (${setup.harness_name}) asks for a key that spends up to ` +
      `${setup.budget_usdc} USDC of your wallet's prepaid credits on this router, ` +
      `until ${when(setup.key_expires_at)}.`
    byId("user-code").textContent = setup.user_code
    byId("harness").textContent = `${setup.harness_name} (${setup.harness})`
    byId("label").textContent = setup.label
    byId("budget").value = setup.budget_usdc
    byId("asked").textContent = setup.budget_usdc
    byId("key-expiry").textContent = when(setup.key_expires_at)
    byId("network").textContent = `${setup.network} (chain ${setup.chain_id})`
    byId("deadline").textContent = when(setup.expires_at)
    if (setup.wallet !== null) {
      byId("bound-label").hidden = false
      byId("bound").hidden = false
      byId("bound").textContent = `only wallet ${setup.wallet} may approve`
    }
    if (setup.status !== "pending") settle(statusText[setup.status] ?? setup.status)
  }

  // EIP-712 wallets refuse typed data for another chain than the active one: switch first when needed.
  const useChain = async (chainId) => {
    const wanted = `0x${chainId.toString(16)}`
    const active = await window.ethereum.request({ method: "eth_chainId" }).catch(() => wanted)
    if (String(active).toLowerCase() === wanted) return
    try {
      await window.ethereum.request({ method: "wallet_switchEthereumChain", params: [{ chainId: wanted }] })
    } catch (error) {
      if (error?.code === 4902)
        throw new Error(`Your wallet does not know chain ${chainId}; add it, then approve again.`)
      throw error
    }
  }

  const approve = async (setup) => {
    const budget = parseUsdc(byId("budget").value)
    if (budget === undefined || budget <= 0n) {
      return show("error", "Enter a spending limit in USDC, e.g. 5 or 2.50 (at most 6 decimals).")
    }
    if (budget > BigInt(setup.budget)) {
      return show("error", `The limit can be lowered, not raised above ${setup.budget_usdc} USDC.`)
    }
    if (window.ethereum === undefined) {
      return show("error", "No wallet found in this browser. Open this page in a browser with a wallet.")
    }
    try {
      show("ok", "Waiting for your wallet…")
      const [account] = await window.ethereum.request({ method: "eth_requestAccounts" })
      if (account === undefined) return show("error", "The wallet shared no account.")
      await useChain(setup.chain_id)
      const typed = setup.typed_data
      const data = { ...typed, message: { ...typed.message, wallet: account, budget: budget.toString() } }
      const signature = await window.ethereum.request({
        method: "eth_signTypedData_v4",
        params: [account, JSON.stringify(data)]
      })
      const reply = await request(
        "POST",
        `/v1/agent-setup/sessions/${encodeURIComponent(setup.user_code)}/approve`,
        {
          wallet: account,
          budget: Number(budget),
          signature
        }
      )
      if (!reply.ok) return show("error", errorText(reply.json, reply.status))
      settle(`${statusText.approved} Limit: ${reply.json.approved_budget_usdc} USDC, owned by ${account}.`)
    } catch (error) {
      show(
        "error",
        error?.code === 4001
          ? "You declined in the wallet; nothing was approved."
          : String(error?.message ?? error)
      )
    }
  }

  const deny = async (setup) => {
    const reply = await request(
      "POST",
      `/v1/agent-setup/sessions/${encodeURIComponent(setup.user_code)}/deny`
    )
    if (!reply.ok) return show("error", errorText(reply.json, reply.status))
    settle(statusText.denied, "error")
  }

  const load = async (code) => {
    const reply = await request("GET", `/v1/agent-setup/sessions/${encodeURIComponent(code)}`)
    if (!reply.ok) return show("error", errorText(reply.json, reply.status))
    const setup = reply.json
    render(setup)
    byId("approve").addEventListener("click", () => approve(setup))
    byId("deny").addEventListener("click", () => deny(setup))
  }

  const code = new URLSearchParams(window.location.search).get("code")
  if (code === null || code === "") {
    byId("ask").hidden = false
    byId("ask").addEventListener("submit", (event) => {
      event.preventDefault()
      window.location.search = `?code=${encodeURIComponent(byId("ask-code").value.trim())}`
    })
  } else {
    load(code)
  }
})()
