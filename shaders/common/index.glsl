// Linear invocation index over the (x, y) grid of 1-D workgroups that VulkanDevice::grid()
// produces (x is capped at maxComputeWorkGroupCount[0]). Macros, not functions: they must see
// the shader's local_size declaration, wherever this file is included.
#define ct_linear_index()                                                                  \
  ((gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x +       \
   gl_LocalInvocationID.x)
// Linear workgroup index over the same grid (one workgroup per row in row-wise kernels).
#define ct_group_index() (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x)
