// cjax::io — see API.md; filled in by its family.
#pragma once
