// The ops version of both extensions (kog_backend._C: version.cpp; kog_backend._C_test: testing/test_bindings.cpp).
// Bumped whenever an op's schema changes; kog_backend.ops.EXPECTED_VERSION must equal it.
#pragma once

#define KOG_OPS_VERSION 9
