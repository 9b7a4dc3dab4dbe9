"""The KV relay: one datacenter's KV events carried to the other's routers in compact form
(``wire``), published by ``relay`` (``pdd-router kv-relay``) and applied by ``receiver``."""
