#include "ops.h"

namespace kog {

int64_t version() { return 2; }

}  // namespace kog
