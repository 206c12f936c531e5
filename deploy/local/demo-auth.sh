# shellcheck shell=bash
#
# deploy/local/demo-auth.sh: bearer tokens and signed callbacks for the demo scripts (source it
# after setting BIN and SECRET). The services verify HS256 tokens under JWT_HS256_SECRET (a
# random one per run unless set); `mint-token` signs them as an identity provider would:
#
#   token alice                       # a customer token (sub = alice)
#   token demo-ops --role operator    # an operator token
#   ops  <curl args>                  # curl as the operator (catalog, warehouse, stock)
#   as alice <curl args>              # curl as customer alice (her orders only)
#   callback <base> <path> <body>     # POST a payment/refund callback, timestamped and signed

# The demo's secrets are published in these scripts; the services refuse such secrets without
# this development flag (docs/src/security.md: "Secrets"). Never set it in a deployment.
export ALLOW_WEAK_SECRETS=true
export JWT_HS256_SECRET="${JWT_HS256_SECRET:-demo-jwt-$(openssl rand -hex 16)}"
export JWT_ISSUER="${JWT_ISSUER:-outbox-demo}" JWT_AUDIENCE="${JWT_AUDIENCE:-outbox-shop}"

token() { "${BIN:-target/release}/mint-token" --sub "$1" "${@:2}"; }
OPS_TOKEN=$(token demo-ops --role operator)
ops() { curl -s -H "Authorization: Bearer $OPS_TOKEN" "$@"; }
as() { local user=$1; shift; curl -s -H "Authorization: Bearer $(token "$user")" "$@"; }

# X-Signature-Timestamp is the Unix time; X-Signature the HMAC-SHA256 of "<timestamp>.<body>".
callback() { # base path body
    local ts sig
    ts=$(date +%s)
    sig=$(printf '%s.%s' "$ts" "$3" | openssl dgst -sha256 -hmac "${SECRET:?}" -r | cut -d' ' -f1)
    curl -s -X POST "$1$2" -H 'Content-Type: application/json' \
        -H "X-Signature-Timestamp: $ts" -H "X-Signature: $sig" -d "$3"
}
