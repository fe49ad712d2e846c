# bench/gpu/bench.mk: the GPU benchmarks' C programs, built against the library with the
# Makefile's flags: make -f Makefile -f bench/gpu/bench.mk build/bench/bert_step
# (BUILD=... as for the Makefile; CUDA=0 builds a CPU-only one).
$(BUILD)/bench/%: bench/gpu/%.c $(BUILD)/libdmove.a $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(BUILD)/libdmove.a -o $@ $(LDLIBS)
