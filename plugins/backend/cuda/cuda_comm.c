/*
 * plugins/backend/cuda/cuda_comm.c — the collectives of a sharded cuda
 * instance (tensor and expert parallelism), over whichever communicator the
 * executor handed load_shard / load_stage:
 *   device (NCCL, loom's peer-to-peer kernels): the device buffers go to
 *     the communicator with this instance's stream, nothing synchronises;
 *   host (loom_comm.host_memory: the tp / pp executors' threads, every rank
 *     possibly on one GPU): each buffer is copied into one pinned staging
 *     area, the stream drained, the host collective run on the copies, and
 *     the result copied back on the stream. The copy back is enqueued before
 *     anything the step enqueues next (the next collective's copy down
 *     included), so one staging area serves every call; steps that make
 *     such calls are never captured in a graph (cb_graph_bucket).
 * Nothing to do for a whole model (b->sharded false) in cb_all_reduce.
 */
#include "cuda_backend.h"

#include <stdint.h>

/* The staging, at least `bytes`: grown here, so only the collectives
 * actually made size it (the stream drained first: a copy back may still
 * read the old area). */
static loom_status cb_comm_stage(cuda_backend *b, size_t bytes, loom_error *err) {
    if (bytes <= b->comm_stage_bytes) return LOOM_OK;
    loom_status st = CB_CUDA(b, err, cudaStreamSynchronize(b->stream));
    if (st) return st;
    if (b->comm_stage) cudaFreeHost(b->comm_stage);
    b->comm_stage = NULL, b->comm_stage_bytes = 0;
    if ((st = CB_CUDA(b, err, cudaHostAlloc(&b->comm_stage, bytes, cudaHostAllocDefault)))) return st;
    b->comm_stage_bytes = bytes;
    return LOOM_OK;
}

loom_status cb_comm_init(cuda_backend *b, loom_error *err) {
    if (!b->sharded || !b->comm_host) return LOOM_OK;
    const loom_host *h = b->host;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 1)
        h->log(h->ctx, LOOM_LOG_WARN, CB_WHO,
               "rank %d of %d on device %d with collectives through host memory (the executor's threads "
               "communicator): a test setup, every rank on one GPU; executor comm: nccl puts a rank on each "
               "of the %d GPUs",
               b->comm.rank, b->comm.size, b->device, ndev);
    /* what any step needs, so none regrows it: x after the embedding, the
     * logits gather, and the all-to-all form's rows (a slice's pairs out,
     * up to every token's pairs in) */
    const size_t MT = (size_t)b->max_tokens, H = (size_t)b->mc.hidden_size, n = (size_t)b->comm.size;
    size_t need = MT * H * 4;
    const size_t lg = (size_t)b->logits_rows * (size_t)b->vocab_pad * 4 * (n + 1);
    if (lg > need) need = lg;
    if (cb_moe_a2a(b)) {
        const size_t rows = ((MT + n - 1) / n + MT) * (size_t)b->mc.num_experts_used * H * b->elt;
        if (rows > need) need = rows;
    }
    return cb_comm_stage(b, need, err);
}

/* Device bytes [0, n) of `dev` into the staging at `off`, the stream
 * drained so the host may read them. */
static loom_status cb_comm_down(cuda_backend *b, size_t off, const void *dev, size_t n, loom_error *err) {
    loom_status st = LOOM_OK;
    if (n > 0)
        st = CB_CUDA(b, err,
                     cudaMemcpyAsync((uint8_t *)b->comm_stage + off, dev, n, cudaMemcpyDeviceToHost, b->stream));
    return st ? st : CB_CUDA(b, err, cudaStreamSynchronize(b->stream));
}

/* Staging bytes [off, off + n) back into `dev`, on the stream. */
static loom_status cb_comm_up(cuda_backend *b, void *dev, size_t off, size_t n, loom_error *err) {
    if (n == 0) return LOOM_OK;
    return CB_CUDA(b, err, cudaMemcpyAsync(dev, (uint8_t *)b->comm_stage + off, n, cudaMemcpyHostToDevice, b->stream));
}

loom_status cb_all_reduce(cuda_backend *b, void *buf, int64_t count, loom_dtype dt, loom_error *err) {
    if (!b->sharded) return LOOM_OK;
    if (!b->comm_host)
        return b->comm.all_reduce_sum(b->comm.ctx, b->comm.rank, buf, count, dt, (void *)b->stream, err);
    const size_t n = loom_dtype_row_bytes(dt, count);
    loom_status st;
    if ((st = cb_comm_stage(b, n, err)) || (st = cb_comm_down(b, 0, buf, n, err)) ||
        (st = b->comm.all_reduce_sum(b->comm.ctx, b->comm.rank, b->comm_stage, count, dt, NULL, err)))
        return st;
    return cb_comm_up(b, buf, 0, n, err);
}

loom_status cb_all_gather(cuda_backend *b, const void *send, void *recv, int64_t count, loom_dtype dt,
                          loom_error *err) {
    if (!b->comm_host)
        return b->comm.all_gather(b->comm.ctx, b->comm.rank, send, recv, count, dt, (void *)b->stream, err);
    const size_t n = loom_dtype_row_bytes(dt, count), all = n * (size_t)b->comm.size;
    loom_status st;
    if ((st = cb_comm_stage(b, n + all, err)) || (st = cb_comm_down(b, 0, send, n, err)) ||
        (st = b->comm.all_gather(b->comm.ctx, b->comm.rank, b->comm_stage, (uint8_t *)b->comm_stage + n, count, dt,
                                 NULL, err)))
        return st;
    return cb_comm_up(b, recv, n, all, err);
}

loom_status cb_all_to_allv(cuda_backend *b, const void *send, const int64_t *send_counts, void *recv,
                           const int64_t *recv_counts, loom_dtype dt, loom_error *err) {
    if (!b->comm_host)
        return b->comm.all_to_allv(b->comm.ctx, b->comm.rank, send, send_counts, recv, recv_counts, dt,
                                   (void *)b->stream, err);
    int64_t ns = 0, nr = 0;
    for (int32_t k = 0; k < b->comm.size; k++) ns += send_counts[k], nr += recv_counts[k];
    const size_t sb = loom_dtype_row_bytes(dt, ns), rb = loom_dtype_row_bytes(dt, nr);
    loom_status st;
    if ((st = cb_comm_stage(b, sb + rb, err)) || (st = cb_comm_down(b, 0, send, sb, err)) ||
        (st = b->comm.all_to_allv(b->comm.ctx, b->comm.rank, sb ? b->comm_stage : NULL, send_counts,
                                  rb ? (uint8_t *)b->comm_stage + sb : NULL, recv_counts, dt, NULL, err)))
        return st;
    return cb_comm_up(b, recv, sb, rb, err);
}
