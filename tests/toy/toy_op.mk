# The toy op (tests/toy/toy_op.c, issue 38): a test program like src/*/*_test.c, linked against
# the static library; tests/run-tests runs it with the unit tests (build/tests/toy_op).
$(BUILD)/tests/toy_op: $(BUILD)/obj/tests/toy/toy_op.o $(BUILD)/libdtrain.a
	@mkdir -p $(BUILD)/tests
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libdtrain.a $(LDLIBS)
all: $(BUILD)/tests/toy_op
