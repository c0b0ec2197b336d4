"""ortllm.store: the local model store's command-line side (`ortllm pull/list/show/rm/cp/ps`).

The store itself (layout, blobs, names, garbage collection) is ortllm.runtime.store, which the engine and the
service use to resolve names; this package adds what needs the build pipeline (pull) and the printing."""
