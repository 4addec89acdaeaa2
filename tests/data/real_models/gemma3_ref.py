# Independent f32/f64 numpy forward of Gemma 3 (HF modeling semantics) from a GGUF, for checking Loom.
import sys, json, numpy as np, gguf
from gguf.quants import dequantize
path, ids = sys.argv[1], json.loads(sys.argv[2])
r = gguf.GGUFReader(path)
T = {t.name: t for t in r.tensors}
def W(name):
    t = T[name]
    a = dequantize(t.data, t.tensor_type)
    return np.asarray(a, dtype=np.float64).reshape([int(x) for x in reversed(t.shape)]) if a.ndim==1 else np.asarray(a, dtype=np.float64)
f = r.fields
def fv(k): return f[k].contents()
E = fv('gemma3.embedding_length'); L = fv('gemma3.block_count'); H = fv('gemma3.attention.head_count'); Hkv = fv('gemma3.attention.head_count_kv')
D = fv('gemma3.attention.key_length'); eps = fv('gemma3.attention.layer_norm_rms_epsilon'); base = fv('gemma3.rope.freq_base')
emb = W('token_embd.weight')
def rms(x, w): return x / np.sqrt((x*x).mean(-1, keepdims=True) + eps) * w
def rope(x, pos, theta):  # x [T, H, D], NeoX rotate-half
    half = D // 2
    inv = theta ** (-np.arange(half) * 2.0 / D)
    ang = np.outer(pos, inv)  # [T, half]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)
def gelu(x): return 0.5 * x * (1 + np.tanh(np.sqrt(2/np.pi) * (x + 0.044715 * x**3)))
n = len(ids); pos = np.arange(n)
x = emb[ids] * np.sqrt(E)
for l in range(L):
    p = f'blk.{l}.'
    local = (l + 1) % 6 != 0
    h = rms(x, W(p+'attn_norm.weight'))
    q = (h @ W(p+'attn_q.weight').T).reshape(n, H, D); k = (h @ W(p+'attn_k.weight').T).reshape(n, Hkv, D); v = (h @ W(p+'attn_v.weight').T).reshape(n, Hkv, D)
    q = rms(q, W(p+'attn_q_norm.weight')); k = rms(k, W(p+'attn_k_norm.weight'))
    th = 10000.0 if local else base
    q = rope(q, pos, th); k = rope(k, pos, th)
    out = np.zeros((n, H, D))
    for hh in range(H):
        kh = hh // (H // Hkv)
        s = q[:, hh, :] @ k[:, kh, :].T / np.sqrt(D)
        mask = np.tril(np.ones((n, n), bool))
        if local: mask &= (pos[:, None] - pos[None, :]) < 512
        s = np.where(mask, s, -np.inf); s = s - s.max(-1, keepdims=True); pr = np.exp(s); pr /= pr.sum(-1, keepdims=True)
        out[:, hh, :] = pr @ v[:, kh, :]
    o = out.reshape(n, H * D) @ W(p+'attn_output.weight').T
    x = x + rms(o, W(p+'post_attention_norm.weight'))
    h = rms(x, W(p+'ffn_norm.weight'))
    g = gelu(h @ W(p+'ffn_gate.weight').T) * (h @ W(p+'ffn_up.weight').T)
    x = x + rms(g @ W(p+'ffn_down.weight').T, W(p+'post_ffw_norm.weight'))
logits = rms(x[-1:], W('output_norm.weight')) @ emb.T
top = np.argsort(-logits[0])[:3]
print(json.dumps([[int(i), float(logits[0, i])] for i in top]))
