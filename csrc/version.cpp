#include "ops.h"

namespace kog {

int64_t version() { return 3; }

}  // namespace kog
