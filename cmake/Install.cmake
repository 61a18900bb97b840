include(CMakePackageConfigHelpers)

install(TARGETS rdmachan EXPORT rdmachanTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/rdmachan DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT rdmachanTargets NAMESPACE rdmachan:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/rdmachan)

configure_package_config_file(cmake/rdmachanConfig.cmake.in
    ${PROJECT_BINARY_DIR}/rdmachanConfig.cmake
    INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/rdmachan)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/rdmachanConfigVersion.cmake
    COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/rdmachanConfig.cmake ${PROJECT_BINARY_DIR}/rdmachanConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/rdmachan)

# The .pc file finds its prefix relative to itself, so an installed tree can be moved.
file(RELATIVE_PATH RDMACHAN_PC_TO_PREFIX /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
# libpmix is private too, and only there when the PMIx bootstrap was built.
set(RDMACHAN_PC_REQUIRES_PMIX "")
if(PMIX_FOUND)
    set(RDMACHAN_PC_REQUIRES_PMIX " pmix")
endif()
configure_file(cmake/rdmachan.pc.in ${PROJECT_BINARY_DIR}/rdmachan.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/rdmachan.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
